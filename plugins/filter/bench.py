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


def _profile_figures(figures, profile_name, source, problems_of, expected, key):
    """The entries of a figures file (a mapping of profile name to a list) for a profile, checked."""
    if not isinstance(figures, dict):
        raise AnsibleFilterError(BenchError(f"a {type(figures).__name__} in {source}",
                                            "a mapping of profile name to a list", "correct the file",
                                            key=key).line())
    points = figures.get(profile_name) or []
    problems = problems_of(points)
    if problems:
        raise AnsibleFilterError(BenchError(f"{'; '.join(problems)} for {profile_name} in {source}", expected,
                                            "correct the file", key=key).line())
    return points


def bench_published(figures, profile_name, source="the published figures file"):
    """The published points for a profile (a mapping of profile name to its points), checked."""
    return _profile_figures(figures, profile_name, source, published_problems,
                            "points with metric (decode, prefill or ttft), value and source", "bench_published_file")


def bench_headline(figures, profile_name, source="the headline figures file"):
    """The published headline figures for a profile (a mapping of profile name to its figures), checked."""
    return _profile_figures(figures, profile_name, source, headline_problems,
                            "figures with figure, value and source", "bench_headline_file")


class FilterModule:
    def filters(self):
        return {"bench_grid": bench_grid, "bench_headline": bench_headline, "bench_needle": bench_needle,
                "bench_published": bench_published}
