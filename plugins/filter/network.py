# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Address arithmetic for templates, without extra Python dependencies on the controller."""

from __future__ import annotations

import ipaddress


def subnet_of(address: str, prefix: int) -> str:
    """The network in CIDR form that holds `address` with the given prefix length: 10.0.0.7, 24 -> 10.0.0.0/24."""
    return str(ipaddress.ip_interface(f"{address}/{int(prefix)}").network)


def nth_address(subnet: str, index: int) -> str:
    """The index-th address of a subnet, negative from its end: 10.0.0.0/24, -2 -> 10.0.0.254."""
    return str(ipaddress.ip_network(subnet)[int(index)])


class FilterModule:
    def filters(self):
        return {"subnet_of": subnet_of, "nth_address": nth_address}
