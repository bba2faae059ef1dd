# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Find the Debian archive this machine already uses, from its own apt configuration.

The lab's base image is bootstrapped from that mirror; no mirror is ever written into the repository.
Both formats are read: deb822 `*.sources` files and one-line `sources.list` entries.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    enabled: bool = True


def parse_deb822(text: str) -> list[Source]:
    sources = []
    for stanza in _stanzas(text):
        fields = {}
        current = None
        for line in stanza:
            if line[0] in " \t" and current:  # continuation of a multi-line field
                fields[current] += " " + line.strip()
                continue
            key, sep, value = line.partition(":")
            if sep:
                current = key.strip().lower()
                fields[current] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        enabled = fields.get("enabled", "yes").lower() not in ("no", "false", "0")
        for uri in fields.get("uris", "").split():
            sources.append(Source(uri, tuple(fields.get("suites", "").split()),
                                  tuple(fields.get("components", "").split()), enabled))
    return sources


def _stanzas(text: str) -> list[list[str]]:
    stanzas, current = [], []
    for raw in text.splitlines():
        if raw.lstrip().startswith("#"):
            continue
        if not raw.strip():
            if current:
                stanzas.append(current)
            current = []
            continue
        current.append(raw.rstrip())
    if current:
        stanzas.append(current)
    return stanzas


def parse_one_line(text: str) -> list[Source]:
    sources = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) < 3 or words[0] != "deb":
            continue
        words = words[1:]
        if words[0].startswith("["):  # options such as [arch=amd64 signed-by=...]
            while words and not words[0].endswith("]"):
                words.pop(0)
            words.pop(0)
        if len(words) >= 2:
            sources.append(Source(words[0], (words[1],), tuple(words[2:])))
    return sources


def configured_sources(root: str = "/") -> list[Source]:
    """Every enabled `deb` source of the machine, in apt's reading order."""
    etc = os.path.join(root, "etc/apt")
    sources = []
    main_list = os.path.join(etc, "sources.list")
    if os.path.isfile(main_list):
        sources += parse_one_line(_text(main_list))
    for path in sorted(glob.glob(os.path.join(etc, "sources.list.d", "*"))):
        if path.endswith(".sources"):
            sources += parse_deb822(_text(path))
        elif path.endswith(".list"):
            sources += parse_one_line(_text(path))
    return [source for source in sources if source.enabled]


def _text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def archive_mirror(suite: str, sources: list[Source]) -> str | None:
    """The URI of the first source that carries `suite` with the main component (the archive, not security)."""
    for source in sources:
        if suite in source.suites and "main" in source.components:
            return source.uri
    return None
