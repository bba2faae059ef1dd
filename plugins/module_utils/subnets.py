# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Choose lab subnets that collide with nothing already on the machine."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable


def free_subnets(pool: str, prefix: int, used: Iterable[str], count: int) -> list[str]:
    """The first `count` subnets of size /prefix in `pool` that overlap none of `used`.

    `used` holds networks in CIDR form (routes, other Docker networks); a default route (0.0.0.0/0) is
    not a claim on any address and is ignored. Raises ValueError when the pool runs out.
    """
    taken = []
    for text in used:
        network = ipaddress.ip_network(text, strict=False)
        if network.version == 4 and network.prefixlen > 0:
            taken.append(network)
    chosen: list[str] = []
    for candidate in ipaddress.ip_network(pool).subnets(new_prefix=prefix):
        if any(candidate.overlaps(network) for network in taken):
            continue
        chosen.append(str(candidate))
        taken.append(candidate)
        if len(chosen) == count:
            return chosen
    raise ValueError(f"found only {len(chosen)} free /{prefix} subnet(s) in {pool}; expected {count}; "
                     "fix: set lab_subnet_pool to a range this machine does not use")


def host_addresses(subnet: str, count: int, first: int = 10) -> list[str]:
    """`count` consecutive host addresses of `subnet`, starting at its `first`-th address."""
    network = ipaddress.ip_network(subnet)
    if first + count > network.num_addresses - 1:
        raise ValueError(f"found {network} too small for {count} hosts from address {first}; "
                         "expected room for every node; fix: use a larger subnet")
    return [str(network.network_address + first + index) for index in range(count)]
