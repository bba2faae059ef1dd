# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""A count of the controller's costly steps, for tests and for anyone asking why a run is slow.

With the environment variable SPARKFLEET_TRACE naming a file, every profile load and every capacity plan
appends one line to it (`profile <name>`, `plan <profile>`). Ansible's workers are forked processes, so each
line is written with one O_APPEND write. Unset (the normal case), nothing is written.
"""

from __future__ import annotations

import os


def event(kind: str, name: str) -> None:
    path = os.environ.get("SPARKFLEET_TRACE")
    if not path:
        return
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, f"{kind} {name}\n".encode())
    finally:
        os.close(descriptor)
