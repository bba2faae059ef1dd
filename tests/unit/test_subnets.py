"""Lab subnets never overlap the machine's routes or other Docker networks."""

import json

import pytest

from ansible_collections.sparkfleet.cluster.plugins.module_utils.subnets import free_subnets, host_addresses
from ansible_collections.sparkfleet.cluster.plugins.modules.lab_subnets import docker_networks


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


class FakeModule:
    """run_command returns the scripted (rc, out, err) answers in turn and records each argv; fail_json raises."""

    def __init__(self, answers):
        self.answers, self.calls = list(answers), []

    def run_command(self, argv, check_rc=False):
        self.calls.append(argv)
        rc, out, err = self.answers.pop(0)
        assert not (check_rc and rc), (argv, err)
        return rc, out, err

    def fail_json(self, msg):
        raise RuntimeError(msg)


def network(name, subnet):
    return {"Name": name, "IPAM": {"Config": [{"Subnet": subnet}]}}


def test_a_network_removed_between_listing_and_inspection_is_listed_again():
    module = FakeModule([(0, "aaa\nbbb\n", ""), (1, json.dumps([network("one", "10.213.0.0/24")]),
                                                 "Error response from daemon: No such network: bbb\n"),
                         (0, "aaa\n", ""), (0, json.dumps([network("one", "10.213.0.0/24")]), "")])
    assert docker_networks(module) == {"one": ["10.213.0.0/24"]}
    assert [argv[:3] for argv in module.calls] == [["docker", "network", "ls"], ["docker", "network", "inspect"]] * 2


def test_another_inspection_failure_is_reported_not_retried():
    module = FakeModule([(0, "aaa\n", ""), (1, "", "permission denied while trying to connect to the daemon\n")])
    with pytest.raises(RuntimeError, match=r"found `docker network inspect` failing \(rc 1: permission denied.*fix: "):
        docker_networks(module)
    assert len(module.calls) == 2


def test_an_inspection_failure_that_says_nothing_is_reported_not_retried():
    module = FakeModule([(0, "aaa\n", ""), (1, "", "")])
    with pytest.raises(RuntimeError, match=r"found `docker network inspect` failing \(rc 1: \)"):
        docker_networks(module)
    assert len(module.calls) == 2
