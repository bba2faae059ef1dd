"""The build node's side of the image transfer: what a peer's key may ask for (an SSH forced command)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIP = os.path.join(ROOT, "roles", "vllm_image", "files", "sparkfleet-image-ship")


def serve(request, tmp_path, *allow):
    """Run serve as sshd runs a forced command, with a docker on PATH that records any call."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "docker").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/docker-calls\n")
    (fake / "docker").chmod(0o755)
    env = dict(os.environ, SSH_ORIGINAL_COMMAND=request, PATH=f"{fake}:{os.environ['PATH']}")
    argv = [sys.executable, SHIP, "serve"] + [arg for name in allow for arg in ("--allow", name)]
    result = subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False)  # stdout: zstd bytes
    result.stderr = result.stderr.decode()
    return result


@pytest.mark.parametrize("request_", [
    "send other/repo:abc123",                       # another repository
    "send sparkfleet/vllm:abc; rm -rf /",           # a shell command after the request
    "send sparkfleet/vllm:abc\nsend other/x:1",     # a second line
    "send sparkfleet/vllm@sha256:" + "0" * 64,      # a digest, not a tag
    "send sparkfleet/vllm",                         # no tag
    "sh -c id",                                     # not a request at all
    "",                                             # nothing
    "send ../sparkfleet/vllm:abc",                  # a path trick
])
def test_anything_but_one_image_of_an_allowed_repository_is_refused(request_, tmp_path):
    result = serve(request_, tmp_path, "sparkfleet/vllm")
    assert result.returncode == 2
    assert "refused request" in result.stderr and "expected 'send <repository>:<tag>' for sparkfleet/vllm" in (
        result.stderr)
    assert not (tmp_path / "docker-calls").exists()  # docker was never called


def test_an_allowed_image_is_saved_and_nothing_else_is_run(tmp_path):
    result = serve("send sparkfleet/vllm:3f2a9c41d0b7", tmp_path, "sparkfleet/vllm")
    assert (tmp_path / "docker-calls").read_text().splitlines() == ["save sparkfleet/vllm:3f2a9c41d0b7"]
    assert result.returncode == 0, result.stderr
