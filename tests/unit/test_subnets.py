"""Lab subnets never overlap the machine's routes or other Docker networks."""

import pytest

from ansible_collections.sparkfleet.cluster.plugins.module_utils.subnets import free_subnets, host_addresses


def test_skips_used_ranges_and_ignores_default_route():
    used = ["0.0.0.0/0", "10.213.0.0/24", "10.213.1.128/25", "172.17.0.0/16"]
    assert free_subnets("10.213.0.0/16", 24, used, 2) == ["10.213.2.0/24", "10.213.3.0/24"]


def test_a_wide_route_covering_the_pool_exhausts_it():
    with pytest.raises(ValueError, match="found only 0 free /24 subnet"):
        free_subnets("10.213.0.0/22", 24, ["10.0.0.0/8"], 1)


def test_chosen_subnets_do_not_overlap_each_other():
    chosen = free_subnets("10.213.0.0/23", 24, [], 2)
    assert chosen == ["10.213.0.0/24", "10.213.1.0/24"]
    with pytest.raises(ValueError, match="found only 2"):
        free_subnets("10.213.0.0/23", 24, [], 3)


def test_host_addresses_from_the_tenth():
    assert host_addresses("10.213.5.0/24", 4) == ["10.213.5.10", "10.213.5.11", "10.213.5.12", "10.213.5.13"]
    with pytest.raises(ValueError, match="too small"):
        host_addresses("10.213.5.0/29", 2)
