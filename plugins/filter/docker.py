# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Docker's daemon.json with sparkfleet's keys merged in, and what an image inspection says about one image.

``existing | sparkfleet.cluster.docker_daemon_config(max_size, max_file, nvidia)``
``info.images | sparkfleet.cluster.image_summary`` (documented in image_summary.yml)
``host_info.images | sparkfleet.cluster.stale_image_tags(repository, keep)`` (documented in stale_image_tags.yml)
"""

from __future__ import annotations

import copy
from typing import Any

DOCUMENTATION = r"""
---
name: docker_daemon_config
short_description: Merge sparkfleet's settings into Docker's daemon.json, keeping everything else
description:
  - Sets the C(json-file) log driver with size limits and, when asked, the C(nvidia) runtime
    (C(nvidia-container-runtime)), as C(nvidia-ctk runtime configure) would; every other key of the existing
    file is kept as it is, so a second run finds nothing to change.
  - A C(log-driver) other than C(json-file) or C(local) already set is kept, and no size limits are added (dockerd
    refuses C(max-size) and C(max-file) for drivers such as journald).
version_added: 0.3.0
options:
  _input:
    description: The current daemon.json as a mapping (empty when the file does not exist).
    type: dict
    required: true
  log_max_size:
    description: C(log-opts.max-size).
    type: str
    default: 100m
  log_max_file:
    description: C(log-opts.max-file).
    type: int
    default: 3
  nvidia:
    description: Register the C(nvidia) runtime.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: The merged configuration
  ansible.builtin.set_fact:
    daemon: "{{ current | sparkfleet.cluster.docker_daemon_config('100m', 3, true) }}"
"""

RETURN = r"""
_value:
  description: The merged daemon.json.
  type: dict
"""


def docker_daemon_config(existing: dict[str, Any] | None, log_max_size: str = "100m", log_max_file: int = 3,
                         nvidia: bool = False) -> dict[str, Any]:
    config = copy.deepcopy(existing if existing is not None else {})
    if not isinstance(config, dict):
        raise ValueError(f"daemon.json holds a {type(config).__name__}, expected a JSON object")
    if config.get("log-driver", "json-file") in ("json-file", "local"):
        # Size limits exist for these two drivers only: dockerd refuses to start with them on journald or syslog.
        config.setdefault("log-driver", "json-file")
        opts = dict(config.get("log-opts") or {})
        opts["max-size"] = str(log_max_size)
        opts["max-file"] = str(log_max_file)  # Docker reads log-opts values as strings only
        config["log-opts"] = opts
    if nvidia:
        runtimes = dict(config.get("runtimes") or {})
        nvidia_runtime = dict(runtimes.get("nvidia") or {})
        nvidia_runtime["path"] = "nvidia-container-runtime"
        nvidia_runtime.setdefault("args", [])
        runtimes["nvidia"] = nvidia_runtime
        config["runtimes"] = runtimes
    return config


FINGERPRINT_LABEL = "io.sparkfleet.fingerprint"


def image_summary(images: list[dict[str, Any]] | None, label: str = FINGERPRINT_LABEL) -> dict[str, Any]:
    """The one image community.docker.docker_image_info found for a name: id, size and fingerprint label.

    No image (an empty list, or the module's result missing because the engine did not answer) is the empty summary,
    so a caller compares ids without asking first whether there was one.
    """
    if not images:
        return {"id": "", "size": 0, "fingerprint": ""}
    if not isinstance(images, list) or len(images) != 1 or not isinstance(images[0], dict):
        raise ValueError(f"expected the one image docker_image_info returns for one name, found {images!r:.200}")
    image = images[0]
    labels = (image.get("Config") or {}).get("Labels") or {}
    return {"id": str(image.get("Id") or ""), "size": int(image.get("Size") or 0),
            "fingerprint": str(labels.get(label) or "")}


def stale_image_tags(images: list[dict[str, Any]] | None, repository: str, keep: list[str]) -> list[str]:
    """The repository's tags on images that carry none of the kept tags (docker_host_info's image list).

    An image is kept whole when any of its tags is kept (an old build that is also :previous stays); every other
    image of the repository loses its tags, which removes it once no tag is left.
    """
    prefix = f"{repository}:"
    kept = set(keep)
    stale: list[str] = []
    for image in images or []:
        tags = [tag for tag in (image.get("RepoTags") or []) if tag.startswith(prefix)]
        if tags and not kept.intersection(image.get("RepoTags") or []):
            stale.extend(sorted(tags))
    return stale


class FilterModule:
    def filters(self):
        return {"docker_daemon_config": docker_daemon_config, "image_summary": image_summary,
                "stale_image_tags": stale_image_tags}
