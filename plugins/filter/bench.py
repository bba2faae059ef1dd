# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The benchmark's grid and published figures, checked on the controller before anything runs."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkfleet.cluster.plugins.module_utils.bench import (
    BenchError,
    grid_of,
    headline_problems,
    needle_of,
    published_problems,
)


def bench_grid(profile, name="quick", override=None):
    """The named grid of the profile's bench.grids, or the override, checked against its max_model_len."""
    try:
        return grid_of(profile, name, override or None)
    except BenchError as err:
        raise AnsibleFilterError(err.line()) from None


def bench_needle(profile):
    """The profile's long-context retrieval check (lengths and how it is judged), checked, or None."""
    try:
        return needle_of(profile)
    except BenchError as err:
        raise AnsibleFilterError(err.line()) from None


def bench_published(figures, profile_name, source="the published figures file"):
    """The published points for a profile (a mapping of profile name to its points), checked."""
    if not isinstance(figures, dict):
        raise AnsibleFilterError(BenchError(f"a {type(figures).__name__} in {source}",
                                            "a mapping of profile name to a list of points",
                                            "correct the file", key="bench_published_file").line())
    points = figures.get(profile_name) or []
    problems = published_problems(points)
    if problems:
        raise AnsibleFilterError(BenchError(f"{'; '.join(problems)} for {profile_name} in {source}",
                                            "points with metric (decode, prefill or ttft), value and source",
                                            "correct the file", key="bench_published_file").line())
    return points


def bench_headline(figures, profile_name, source="the headline figures file"):
    """The published headline figures for a profile (a mapping of profile name to its figures), checked."""
    if not isinstance(figures, dict):
        raise AnsibleFilterError(BenchError(f"a {type(figures).__name__} in {source}",
                                            "a mapping of profile name to a list of figures",
                                            "correct the file", key="bench_headline_file").line())
    points = figures.get(profile_name) or []
    problems = headline_problems(points)
    if problems:
        raise AnsibleFilterError(BenchError(f"{'; '.join(problems)} for {profile_name} in {source}",
                                            "figures with figure, value and source", "correct the file",
                                            key="bench_headline_file").line())
    return points


class FilterModule:
    def filters(self):
        return {"bench_grid": bench_grid, "bench_headline": bench_headline, "bench_needle": bench_needle,
                "bench_published": bench_published}
