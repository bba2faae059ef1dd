# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Sizes for people, the same way in modules and templates."""

from __future__ import annotations

from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights import human_bytes


class FilterModule:
    def filters(self):
        return {"human_bytes": human_bytes}
