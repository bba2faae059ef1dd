# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Secrets out of text that leaves a node: by value, by name in environment and JSON files, and by shape.

Pure Python (stdlib only), on bytes, so a log with a stray binary byte is redacted like any other. What is
replaced, everywhere, by ``<redacted>``:

- every occurrence of each secret value the caller knows (the API key, the Hugging Face token), also JSON- and
  URL-escaped, also broken by a line break anywhere inside it (a wrapped line), and a file that ends part-way
  into one (a line still being written when it was read);
- the value after ``Bearer`` and after ``Authorization: Basic|Token|Digest``, and ``hf_...``-shaped tokens;
- in environment text (``kind="env"``: env files, ``systemctl show``, ``docker inspect``), the value of every
  ``NAME=value`` whose name holds TOKEN, KEY, SECRET, PASSWORD or PASSWD (any case); in JSON text
  (``kind="json"``) every string value whose key holds one of them.

Values found under such names in environment text are worth redacting wherever else they appear (a key the
head's env file holds and a journal line quotes): ``harvest`` returns them, and ``Redactor.add`` takes them.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable

REDACTED = b"<redacted>"
# Names whose values are secrets, in environment and JSON text.
SECRET_NAME = re.compile(rb"TOKEN|KEY|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
# Names that match SECRET_NAME and hold no secret (the tokenizers' thread switch of a profile's vllm_env).
NOT_SECRET = frozenset({b"TOKENIZERS_PARALLELISM"})
# A value found by name elsewhere is redacted by value only from this length on (shorter ones would blank
# every "1" of a bundle); it stays redacted by name where it was found.
HARVEST_MIN = 8
# A file that ends part-way into a secret: its last characters are redacted from this many on.
PARTIAL_MIN = 4

_ENV_LINE = re.compile(rb"(?m)^[ \t]*(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*=[ \t]*(.*?)[ \t\r]*$")
# Every NAME=value inside a line (systemctl show's Environment=A=b C=d, docker's "Env": ["A=b"]), overlapping.
_ENV_INLINE = re.compile(rb"(?<![A-Za-z0-9_])(?=([A-Za-z_][A-Za-z0-9_]*)=([^\s\"',;]+))")
_JSON_STRING = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:\s*"((?:[^"\\]|\\.)*)"')
_BEARER = re.compile(rb"(?i)\bbearer[ \t]+([A-Za-z0-9._~+/=-]+)")
_AUTHORIZATION = re.compile(rb"(?i)\bauthorization[\"']?[ \t]*[:=][ \t]*[\"']?(?:basic|token|digest)[ \t]+"
                            rb"([^\s\"',;]+)")
_HF_TOKEN = re.compile(rb"\bhf_[A-Za-z0-9]{20,}")
# Where a secret may be broken by a wrapped line.
_BREAK = rb"(?:\r?\n)?"


def _as_bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogateescape")


def _secret_name(name: bytes) -> bool:
    return bool(SECRET_NAME.search(name)) and name.upper() not in NOT_SECRET


def _variants(value: bytes) -> set[bytes]:
    """The forms a value takes in the text sparkfleet's nodes write: as it is, JSON-escaped, URL-escaped."""
    forms = {value}
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return forms
    forms.add(json.dumps(text)[1:-1].encode("utf-8"))
    forms.add(json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8"))
    forms.add(urllib.parse.quote(text, safe="").encode("ascii"))
    return {form for form in forms if form}


def _unquote(value: bytes) -> bytes:
    if len(value) >= 2 and value[:1] == value[-1:] and value[:1] in (b'"', b"'"):
        return value[1:-1]
    return value


def harvest(data: bytes) -> set[bytes]:
    """The values of secret-named NAME=value pairs of environment text that are long enough to redact anywhere."""
    found = set()
    for pattern in (_ENV_LINE, _ENV_INLINE):
        for match in pattern.finditer(data):
            value = _unquote(match.group(2))
            if _secret_name(match.group(1)) and len(value) >= HARVEST_MIN:
                found.add(value)
    return found


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(span[0], span[1]) for span in merged]


class Redactor:
    """Redacts the secrets it was given (and those added later) from any bytes."""

    def __init__(self, secrets: Iterable[str | bytes] = ()):
        self._values: set[bytes] = set()
        self._patterns: list[re.Pattern[bytes]] = []
        for secret in secrets:
            self.add(secret)

    @property
    def longest(self) -> int:
        """The longest a match of a known value can be (each byte broken by a CR LF): a tail's safety margin."""
        return 3 * max((len(form) for value in self._values for form in _variants(value)), default=0)

    def add(self, secret: str | bytes) -> bool:
        """Redact this value too from now on; False when it is empty or already known."""
        value = _as_bytes(secret)
        if not value or value in self._values:
            return False
        self._values.add(value)
        for form in sorted(_variants(value), key=len, reverse=True):
            self._patterns.append(re.compile(_BREAK.join(re.escape(form[i:i + 1]) for i in range(len(form)))))
        return True

    def spans(self, data: bytes, kind: str = "text") -> list[tuple[int, int]]:
        """Where in data something is to be redacted, merged, in order."""
        found: list[tuple[int, int]] = []
        for pattern in self._patterns:
            found += [match.span() for match in pattern.finditer(data)]
        for pattern in (_BEARER, _AUTHORIZATION):
            found += [match.span(1) for match in pattern.finditer(data)]
        found += [match.span() for match in _HF_TOKEN.finditer(data)]
        if kind == "env":
            for pattern in (_ENV_LINE, _ENV_INLINE):
                found += [match.span(2) for match in pattern.finditer(data)
                          if match.group(2) and _secret_name(match.group(1))]
        elif kind == "json":
            found += [match.span(2) for match in _JSON_STRING.finditer(data)
                      if match.group(2) and _secret_name(match.group(1))]
        for value in self._values:  # the text ends part-way into a secret
            for size in range(len(value) - 1, PARTIAL_MIN - 1, -1):
                if data.endswith(value[:size]):
                    found.append((len(data) - size, len(data)))
                    break
        return _merge(found)

    def redact(self, data: bytes, kind: str = "text", cut: int = 0) -> tuple[bytes, int]:
        """(data redacted, how many places were). With cut > 0 (a tail read with a margin before it), what lies
        before cut is dropped, from the next line on, and never a part of a redacted place: a secret whose start
        the read cut off lies wholly in the margin."""
        spans = self.spans(data, kind)
        start = 0
        if cut > 0:
            start = min(cut, len(data))
            newline = data.find(b"\n", start)
            if 0 <= newline < len(data) - 1:
                start = newline + 1
            for span_start, span_end in spans:
                if span_start < start < span_end:
                    start = span_end
        out, position, count = [], start, 0
        for span_start, span_end in spans:
            if span_start < start:
                continue
            out += [data[position:span_start], REDACTED]
            position, count = span_end, count + 1
        out.append(data[position:])
        return b"".join(out), count

    def clean(self, text: str) -> str:
        """A short text (a message, a summary line) with every known secret redacted."""
        return self.redact(text.encode("utf-8", "surrogateescape"))[0].decode("utf-8", "replace")
