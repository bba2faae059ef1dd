# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Wheelhouses: Python packages downloaded once on the controller, installed on nodes with no index.

The controller downloads with its own pip configuration (whatever index, local wheel folders and CA
bundle the machine is set up with), so nodes need neither network access to an index nor a trust store
that knows a re-signing proxy. A wheelhouse is complete only once its marker names exactly the
requirements it holds; an interrupted download is resumed by running again.
"""

from __future__ import annotations

import fcntl
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


def platform_tag(target: Target | None = None) -> str:
    """cp311-x86_64: a wheelhouse is valid for one Python and one machine (this interpreter's by default)."""
    if target:
        return f"cp{target.python_version.replace('.', '')}-{target.machine}"
    return f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}"


class Target:
    """The Python, machine and glibc of the nodes a wheelhouse is for, when they differ from the controller's."""

    def __init__(self, python_version: str, machine: str, glibc: str):
        self.python_version, self.machine, self.glibc = python_version, machine, glibc

    def is_here(self) -> bool:
        return (self.python_version == f"{sys.version_info[0]}.{sys.version_info[1]}"
                and self.machine == platform.machine() and self.glibc == platform.libc_ver()[1])

    def pip_args(self) -> list[str]:
        """pip's options to pick wheels for the target: every manylinux tag its glibc accepts (as pip itself
        would on that machine), binary wheels only."""
        major, minor = (int(part) for part in self.glibc.split(".")[:2])
        if major != 2:
            raise WheelhouseError(f"found glibc {self.glibc} on the nodes; expected glibc 2.x; fix: install the "
                                  "node's packages from its own index, or use a controller of the node's kind")
        tags = [f"manylinux_2_{m}_{self.machine}" for m in range(minor, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        tags += [f"{name}_{self.machine}" for m, name in legacy.items() if minor >= m]
        args = ["--only-binary=:all:", "--python-version", self.python_version]
        for tag in [*tags, f"linux_{self.machine}"]:
            args += ["--platform", tag]
        return args


def requirements_key(requirements: Sequence[str], target: Target | None = None) -> str:
    text = "\n".join(sorted(requirements)) + (f"\n{platform_tag(target)}-glibc{target.glibc}" if target else "")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_complete(dest: str, requirements: Sequence[str], target: Target | None = None) -> bool:
    try:
        with open(os.path.join(dest, MARKER), encoding="utf-8") as handle:
            marker = json.load(handle)
    except (OSError, ValueError):
        return False
    return marker.get("key") == requirements_key(requirements, target)


def wheel_count(dest: str) -> int:
    return sum(1 for name in os.listdir(dest) if name.endswith((".whl", ".tar.gz", ".zip")))


def download(requirements: Sequence[str], dest: str, target: Target | None = None) -> bool:
    """Download `requirements` and all their dependencies into `dest`; False when it was already complete.

    With a target that is not this machine, only binary wheels built for the target are taken."""
    if target and target.is_here():
        target = None
    if is_complete(dest, requirements, target):
        return False
    os.makedirs(dest, exist_ok=True)
    # Two runs on one controller (two clusters converged at once) download into the same wheelhouse: one at a time,
    # and the second finds it complete.
    with open(os.path.join(dest, ".lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(dest, requirements, target):
            return False
        _download(requirements, dest, target)
    return True


def _download(requirements: Sequence[str], dest: str, target: Target | None) -> None:
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
            "--dest", dest, *(target.pip_args() if target else []), *requirements]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        # pip's own errors, not the code lines of a traceback it printed (indented) or its header
        lines = [line for line in (proc.stderr or proc.stdout).splitlines()
                 if line.strip() and not line.startswith((" ", "\t", "WARNING: Location 'file:", "Traceback ("))]
        raise WheelhouseError(
            f"found pip download failing for {' '.join(requirements)} (rc {proc.returncode}: "
            f"{' | '.join(lines[-3:])}); expected every wheel to be available through this machine's pip "
            "configuration; fix: correct the requirement (its name, version pin or path), or check the index and "
            "find-links settings (pip config list), and retry")
    tmp = os.path.join(dest, MARKER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"key": requirements_key(requirements, target), "requirements": list(requirements),
                   "platform": platform_tag(target), "wheels": wheel_count(dest)}, handle)
    os.replace(tmp, os.path.join(dest, MARKER))
