# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The one error shape of the collection: what was found, what was expected, what to do.

Every stage refuses bad input and failed checks with this shape, so that a message always reads the same way:
``<where>: <key>: found <...>; expected <...>; fix: <...>``. The concern-specific errors (a capacity plan, a
profile, the weights, the KV pool) are subclasses, so callers can catch one kind or all of them.
"""

from __future__ import annotations


class SparkfleetError(ValueError):
    """A refusal in three parts; `where` (a host or group) and `key` (the setting) are optional."""

    def __init__(self, found: str, expected: str, fix: str, key: str | None = None, where: str | None = None):
        self.found, self.expected, self.fix, self.key, self.where = found, expected, fix, key, where
        super().__init__(self.line())

    def line(self) -> str:
        return line(self.found, self.expected, self.fix, self.key, self.where)


def line(found: str, expected: str, fix: str, key: str | None = None, where: str | None = None) -> str:
    """The one-line form of a refusal."""
    head = "".join(f"{part}: " for part in (where, key) if part)
    return f"{head}found {found}; expected {expected}; fix: {fix}"
