#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Build the lab's Debian base image locally, with no container registry."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: lab_base_image
short_description: Build a Debian image with systemd as PID 1 from debootstrap, cached by a hash of its recipe
description:
  - Bootstraps a minimal Debian root filesystem with C(debootstrap) from the archive this machine's own apt
    configuration names, prepares it to boot systemd inside an unprivileged container, imports it with
    C(docker import) and adds C(STOPSIGNAL SIGRTMIN+3) with an offline C(docker build).
  - The tag is derived from a hash of the recipe (suite, variant, packages, preparation steps), so a second
    run finds the image and does nothing; changing the recipe builds a new tag.
  - Each node generates its own SSH host keys at first boot; the image carries none.
version_added: 0.1.0
options:
  name:
    description: Image repository name; the tag is C(<suite>-<recipe hash>).
    type: str
    default: sparkfleet-lab
  suite:
    description: Debian suite to bootstrap.
    type: str
    default: bookworm
  packages:
    description: Packages installed on top of the minbase variant.
    type: list
    elements: str
    default: [systemd, systemd-sysv, dbus, python3, sudo, openssh-server, iproute2, procps, ca-certificates]
  mirror:
    description:
      - Debian archive URI to bootstrap from.
      - When empty, the first source of the machine's apt configuration that carries O(suite) with the main
        component.
    type: str
    default: ""
  work_dir:
    description: Where the root filesystem is assembled (removed afterwards).
    type: path
    default: /var/tmp
attributes:
  check_mode:
    description: Runs in check mode (C(--check)), reporting what it would change without changing it.
    support: full
  diff_mode:
    description: Returns a diff of what it changes when run with C(--diff).
    support: none
requirements:
  - debootstrap and a running Docker engine on the target (the controller)
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Build (or find) the lab base image
  sparkfleet.cluster.lab_base_image:
    packages: [systemd, systemd-sysv, dbus, python3, sudo, openssh-server, iproute2]
  register: base
"""

RETURN = r"""
image:
  description: The image reference, name and recipe tag.
  returned: success
  type: str
  sample: sparkfleet-lab:bookworm-3f2a9c41d0b7
recipe_hash:
  description: SHA-256 of the recipe.
  returned: success
  type: str
mirror:
  description: The archive the image was (or would be) bootstrapped from; empty when the image was cached.
  returned: success
  type: str
seconds:
  description: Time spent building; 0 when the cached image was used.
  returned: success
  type: float
"""

import hashlib
import json
import os
import shutil
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils.apt_sources import archive_mirror, configured_sources

# Bump when the preparation below changes: it is part of the recipe hash.
PREPARATION_VERSION = 2

# Units that cannot work, or spin, in an unprivileged container.
MASKED_UNITS = [
    "getty.target", "console-getty.service", "systemd-firstboot.service",
    "systemd-udevd.service", "systemd-udevd-control.socket", "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service", "systemd-udev-settle.service",
    "systemd-modules-load.service", "systemd-remount-fs.service",
    "sys-kernel-config.mount", "sys-kernel-debug.mount", "sys-kernel-tracing.mount",
    "sys-fs-fuse-connections.mount", "dev-hugepages.mount", "proc-sys-fs-binfmt_misc.automount",
]

HOSTKEY_DROPIN = """[Service]
# The image ships without host keys so that no two nodes share one: make them at first boot.
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
"""

DOCKERFILE = "FROM {imported}\nSTOPSIGNAL SIGRTMIN+3\n"


def recipe(suite, packages):
    return {"suite": suite, "variant": "minbase", "packages": sorted(set(packages)),
            "masked": MASKED_UNITS, "hostkey_dropin": HOSTKEY_DROPIN, "dockerfile": DOCKERFILE,
            "preparation": PREPARATION_VERSION}


def recipe_hash(suite, packages):
    return hashlib.sha256(json.dumps(recipe(suite, packages), sort_keys=True).encode()).hexdigest()


def run(module, argv, **kwargs):
    rc, out, err = module.run_command(argv, **kwargs)
    if rc != 0:
        module.fail_json(msg=f"found `{' '.join(argv[:3])} ...` failing with exit {rc}: {(err or out).strip()[-2000:]}",
                         rc=rc)
    return out


def prepare(module, rootfs):
    """Make the tree boot systemd in a container and carry no per-machine identity."""
    with open(os.path.join(rootfs, "etc/machine-id"), "w", encoding="utf-8"):
        pass  # empty: systemd makes a fresh id at each container's first boot
    units = os.path.join(rootfs, "etc/systemd/system")
    for unit in MASKED_UNITS:  # what `systemctl mask` does, without needing systemd on the controller
        link = os.path.join(units, unit)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink("/dev/null", link)
    for name in os.listdir(os.path.join(rootfs, "etc/ssh")):
        if name.startswith("ssh_host_"):
            os.unlink(os.path.join(rootfs, "etc/ssh", name))
    dropin = os.path.join(rootfs, "etc/systemd/system/ssh.service.d")
    os.makedirs(dropin, exist_ok=True)
    with open(os.path.join(dropin, "10-sparkfleet-hostkeys.conf"), "w", encoding="utf-8") as handle:
        handle.write(HOSTKEY_DROPIN)
    wants = os.path.join(units, "multi-user.target.wants")
    os.makedirs(wants, exist_ok=True)
    if not os.path.lexists(os.path.join(wants, "ssh.service")):
        os.symlink("/lib/systemd/system/ssh.service", os.path.join(wants, "ssh.service"))
    # Drop the downloaded packages but keep the package lists, as on any installed system: apt's
    # cache_valid_time judges freshness by them, and a node without lists cannot install anything.
    archives = os.path.join(rootfs, "var/cache/apt/archives")
    for entry in os.listdir(archives):
        if entry.endswith(".deb"):
            os.unlink(os.path.join(archives, entry))


def build(module, image, suite, packages, mirror):
    # The intermediate tag is this process's own: two labs made at once may both build a missing image, and the
    # other's untagging must not remove what this build's FROM still needs.
    imported = f"{image}-rootfs-{os.getpid()}"
    workdir = tempfile.mkdtemp(prefix="sparkfleet-lab-", dir=module.params["work_dir"])
    try:
        rootfs = os.path.join(workdir, "rootfs")
        run(module, ["debootstrap", "--variant=minbase", f"--include={','.join(sorted(set(packages)))}",
                     suite, rootfs, mirror])
        prepare(module, rootfs)
        tar = os.path.join(workdir, "rootfs.tar")
        run(module, ["tar", "-C", rootfs, "--numeric-owner", "-cf", tar, "."])
        run(module, ["docker", "import", "--change", 'CMD ["/lib/systemd/systemd"]', "--change", "ENV container=docker",
                     tar, imported])
        with open(os.path.join(workdir, "Dockerfile"), "w", encoding="utf-8") as handle:
            handle.write(DOCKERFILE.format(imported=imported))
        context = os.path.join(workdir, "context")
        os.mkdir(context)
        run(module, ["docker", "build", "-q", "-t", image, "-f", os.path.join(workdir, "Dockerfile"), context],
            environ_update={"DOCKER_BUILDKIT": "0"})
        run(module, ["docker", "image", "rm", imported])  # untag only: the layer stays under the final image
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", default="sparkfleet-lab"),
            suite=dict(type="str", default="bookworm"),
            packages=dict(type="list", elements="str",
                          default=["systemd", "systemd-sysv", "dbus", "python3", "sudo", "openssh-server",
                                   "iproute2", "procps", "ca-certificates"]),
            mirror=dict(type="str", default=""),
            work_dir=dict(type="path", default="/var/tmp"),
        ),
        supports_check_mode=True,
    )
    suite, packages = module.params["suite"], module.params["packages"]
    digest = recipe_hash(suite, packages)
    image = f"{module.params['name']}:{suite}-{digest[:12]}"
    result = dict(image=image, recipe_hash=digest, mirror="", seconds=0.0)

    rc, _out, _err = module.run_command(["docker", "image", "inspect", "--format", "{{.Id}}", image])
    if rc == 0:
        module.exit_json(changed=False, **result)

    mirror = module.params["mirror"] or archive_mirror(suite, configured_sources())
    if not mirror:
        module.fail_json(msg=f"found no apt source for suite {suite} with component main in /etc/apt; "
                             "expected the machine's own Debian archive; fix: configure apt for "
                             f"{suite}, or pass mirror", **result)
    result["mirror"] = mirror
    if module.check_mode:
        module.exit_json(changed=True, **result)
    for tool in ("debootstrap", "docker", "tar"):
        if not module.get_bin_path(tool):
            module.fail_json(msg=f"found no {tool} on the controller; expected it to build the lab image; "
                                 f"fix: install it (make lab installs debootstrap and docker.io)", **result)
    started = time.monotonic()
    build(module, image, suite, packages, mirror)
    result["seconds"] = round(time.monotonic() - started, 1)
    module.exit_json(changed=True, **result)


if __name__ == "__main__":
    main()
