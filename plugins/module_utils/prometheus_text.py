# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Prometheus' text exposition format (version 0.0.4), parsed into samples (what a vLLM server's /metrics says) and
written (sparkfleet's textfiles for node_exporter).

Pure Python (stdlib only): it runs inside an Ansible module on the head node, where no prometheus_client may be
installed. The unit tests hold it to prometheus_client's own parser as the oracle.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class MetricsParseError(ValueError):
    pass


_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    """Parse `{a="x",b="y\\"z"}` starting at line[pos] == "{"; returns the labels and the index after "}"."""
    labels: dict[str, str] = {}
    pos += 1
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        name = _NAME.match(line, pos)
        if not name:
            raise MetricsParseError(f"bad label name at column {pos}: {line[:120]!r}")
        pos = name.end()
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if line[pos: pos + 1] != "=":
            raise MetricsParseError(f'expected = after label {name.group()!r}: {line[:120]!r}')
        pos += 1
        while pos < len(line) and line[pos] in " \t":  # prometheus_client takes blanks around "=" too
            pos += 1
        if line[pos: pos + 1] != '"':
            raise MetricsParseError(f'expected a quoted value of label {name.group()!r}: {line[:120]!r}')
        pos += 1
        value = []
        while True:
            if pos >= len(line):
                raise MetricsParseError(f"unterminated value of label {name.group()!r}: {line[:120]!r}")
            char = line[pos]
            if char == "\\" and pos + 1 < len(line):
                value.append(_ESCAPES.get(line[pos + 1], "\\" + line[pos + 1]))
                pos += 2
            elif char == '"':
                pos += 1
                break
            else:
                value.append(char)
                pos += 1
        labels[name.group()] = "".join(value)
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        else:
            raise MetricsParseError(f"expected , or }} after label {name.group()!r}: {line[:120]!r}")


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (comments skipped; label values unescaped)."""
    samples = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name = _NAME.match(line)
        if not name:
            raise MetricsParseError(f"bad metric name: {line[:120]!r}")
        pos = name.end()
        labels: dict[str, str] = {}
        if pos < len(line) and line[pos] == "{":
            labels, pos = _parse_labels(line, pos)
        rest = line[pos:].split()
        if not rest:
            raise MetricsParseError(f"no value: {line[:120]!r}")
        try:
            value = float(rest[0])
        except ValueError as err:
            raise MetricsParseError(f"bad value {rest[0]!r}: {line[:120]!r}") from err
        samples.append(Sample(name.group(), labels, value))
    return samples


# The writing side: sparkfleet's textfiles for node_exporter (the node collector's, the verification's, the scrub's).
def sample_value(value: Any) -> str | None:
    """A sample's value as text; None for an unknown one (None, not a number, NaN or infinite), which a textfile
    leaves out rather than publishing 0. Whole numbers are written without a fraction."""
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


_LABEL_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})


class Textfile:
    """Prometheus text lines, one HELP and TYPE per metric, samples grouped under them."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def add(self, name: str, help_text: str, value: Any, labels: Mapping[str, Any] | None = None,
            kind: str = "gauge") -> None:
        number = sample_value(value)
        if number is None:
            return  # unknown is left out, not 0
        family = self._families.setdefault(name, (help_text, kind, []))
        text = ",".join(f'{key}="{str(val).translate(_LABEL_ESCAPES)}"' for key, val in sorted((labels or {}).items()))
        family[2].append(f"{name}{{{text}}} {number}" if text else f"{name} {number}")

    def render(self) -> str:
        lines = []
        for name, (help_text, kind, samples) in self._families.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(lines) + "\n"
