# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Wheelhouses: Python packages downloaded once on the controller, installed on nodes with no index.

The controller downloads with its own pip configuration (whatever index, local wheel folders and CA
bundle the machine is set up with), so nodes need neither network access to an index nor a trust store
that knows a re-signing proxy. A wheelhouse is complete only once its marker names exactly the
requirements it holds; an interrupted download is resumed by running again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence

MARKER = ".sparkfleet-wheelhouse.json"


class WheelhouseError(RuntimeError):
    """pip could not download what was asked: what was found, what was expected, what to do."""


def platform_tag() -> str:
    """cp311-x86_64 for this interpreter: wheelhouses are only valid for one Python and one machine."""
    return f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}"


def requirements_key(requirements: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]


def is_complete(dest: str, requirements: Sequence[str]) -> bool:
    try:
        with open(os.path.join(dest, MARKER), encoding="utf-8") as handle:
            marker = json.load(handle)
    except (OSError, ValueError):
        return False
    return marker.get("key") == requirements_key(requirements)


def wheel_count(dest: str) -> int:
    return sum(1 for name in os.listdir(dest) if name.endswith((".whl", ".tar.gz", ".zip")))


def download(requirements: Sequence[str], dest: str, python: str | None = None) -> bool:
    """Download `requirements` and all their dependencies into `dest`; False when it was already complete."""
    if is_complete(dest, requirements):
        return False
    os.makedirs(dest, exist_ok=True)
    argv = [python or sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
            "--dest", dest, *requirements]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr or proc.stdout).splitlines()
                 if line.strip() and not line.startswith("WARNING: Location 'file:")]
        raise WheelhouseError(
            f"found pip download failing for {' '.join(requirements)} (rc {proc.returncode}: "
            f"{' | '.join(lines[-3:])}); expected every wheel to be available through this machine's pip "
            "configuration; fix: check the index and find-links settings (pip config list) and retry")
    tmp = os.path.join(dest, MARKER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"key": requirements_key(requirements), "requirements": list(requirements),
                   "platform": platform_tag(), "wheels": wheel_count(dest)}, handle)
    os.replace(tmp, os.path.join(dest, MARKER))
    return True
