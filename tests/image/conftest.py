"""The pinned vLLM release's own files, from its wheel on the package index, for the seam and image tests."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "files"))

from sparkfleet_vllm import seams  # noqa: E402

WHEEL_CACHE = os.path.expanduser(f"~/.cache/sparkfleet/wheels/vllm-{seams.PINNED_VERSION}")


def download_vllm_wheel(version=seams.PINNED_VERSION, dest=WHEEL_CACHE):
    """vLLM's wheel for this machine, by version, through this machine's pip configuration (kept for later runs)."""
    os.makedirs(dest, exist_ok=True)
    wheels = [name for name in os.listdir(dest) if name.startswith(f"vllm-{version}-") and name.endswith(".whl")]
    if not wheels:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--only-binary=:all:", f"vllm=={version}", "--dest", dest],
            capture_output=True, text=True, check=False)
        wheels = [name for name in os.listdir(dest) if name.startswith(f"vllm-{version}-") and name.endswith(".whl")]
        if proc.returncode != 0 or not wheels:
            pytest.fail(f"found no vllm {version} wheel (pip download exited {proc.returncode}: "
                        f"{proc.stderr.strip()[-800:]}); expected it on the package index; fix the pip configuration")
    return os.path.join(dest, sorted(wheels)[0])


def extract_python_files(wheel, dest):
    """The wheel's vllm/*.py and its dist-info, without the compiled extensions (nothing of CUDA is imported)."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".py") or ".dist-info/" in n]
        archive.extractall(dest, names)
    return dest


@pytest.fixture(scope="session")
def vllm_wheel():
    return download_vllm_wheel()


@pytest.fixture(scope="session")
def vllm_pristine(vllm_wheel, tmp_path_factory):
    """The pinned release's Python files (read-only use): the vllm package directory."""
    return os.path.join(extract_python_files(vllm_wheel, str(tmp_path_factory.mktemp("vllm-pristine"))), "vllm")


@pytest.fixture
def vllm_copy(vllm_pristine, tmp_path):
    """A private copy of the files the seams read or edit, for a test that changes them."""
    target = tmp_path / "vllm"
    for path in sorted({edit.path for seam in seams.SEAMS for edit in seam.edits}):
        os.makedirs(target / os.path.dirname(path), exist_ok=True)
        shutil.copy2(os.path.join(vllm_pristine, path), target / path)
    return str(target)


# --------------------------------------------------------------------------------------------- Docker

STANDIN = f"sparkfleet-standin/vllm:{seams.PINNED_VERSION}"
SECOND_ENGINE_DIR = "/run/sparkfleet-test-engine"
SECOND_ENGINE_DATA = "/var/lib/sparkfleet-test-engine"


def docker(*argv, host=None, check=True, timeout=900, input_text=None):
    # The classic builder, as Docker 20.10 uses by default: its step output is what the tests read.
    env = dict(os.environ, DOCKER_BUILDKIT="0")
    if host:
        env["DOCKER_HOST"] = host
    proc = subprocess.run(["docker", *argv], capture_output=True, text=True, check=False, timeout=timeout,
                          env=env, input=input_text)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}"
                             f"{proc.stderr[-3000:]}")
    return proc


def image_id(reference, host=None):
    proc = docker("image", "inspect", "--format", "{{.Id}}", reference, host=host, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def labels(reference, host=None):
    import json

    return json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", reference, host=host).stdout)


@pytest.fixture(scope="session")
def debian_image(tmp_path_factory):
    """A running Docker engine and the local Debian image (python3 included), made by the lab's own tasks."""
    from runner import output, run_playbook

    base = tmp_path_factory.mktemp("engine")
    result = run_playbook(base / "run", os.path.join(ROOT, "tests/image/playbooks/engine.yml"),
                          extravars={"image_file": str(base / "image")})
    if result.status != "successful":
        pytest.fail("starting the engine or building the Debian image failed:\n" + output(result)[-4000:])
    return (base / "image").read_text().strip()


@pytest.fixture(scope="session")
def standin_base(debian_image, vllm_wheel, tmp_path_factory):
    """The stand-in base: the Debian image plus vLLM 0.33.0's Python package files (no dependencies, no torch).

    Returns its image ID (sha256:...), which the image's Dockerfile takes as a base pinned by content."""
    context = tmp_path_factory.mktemp("standin")
    extract_python_files(vllm_wheel, str(context / "site"))
    (context / "Dockerfile").write_text(
        "ARG DEBIAN\nFROM ${DEBIAN}\n"
        "# Debian's python3 reads /usr/local/lib/python3.X/dist-packages; the version is the image's own.\n"
        "COPY site /opt/site\n"
        "RUN site=$(python3 -c 'import sys; print(f\"/usr/local/lib/python3.{sys.version_info[1]}/dist-packages\")')"
        " && mkdir -p \"$site\" && cp -a /opt/site/. \"$site\"/ && rm -rf /opt/site\n")
    docker("build", "--build-arg", f"DEBIAN={debian_image}", "--tag", STANDIN, str(context))
    return image_id(STANDIN)


@pytest.fixture(scope="session")
def second_engine(debian_image):
    """A second Docker engine on this machine, standing in for a peer node's: its own socket and storage.

    Started here, in a network namespace of its own (an engine without a default bridge deletes the interface
    docker0 where it runs, which is the first engine's), with no iptables rules; stopped by its PID at the end."""
    import shutil as _shutil
    import time

    # A session killed before its end leaves this engine's storage (and maybe the engine) behind, its images
    # half-written: the engine starts from empty storage every time.
    stale = os.path.join(SECOND_ENGINE_DIR, "pid")
    try:
        with open(stale, encoding="ascii") as handle:
            pid = int(handle.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if SECOND_ENGINE_DATA.encode() in handle.read():  # that engine, not a PID reused since
                os.kill(pid, 15)
                for _tick in range(60):
                    if not os.path.exists(f"/proc/{pid}"):
                        break
                    time.sleep(1)
    except (OSError, ValueError):
        pass
    _shutil.rmtree(SECOND_ENGINE_DATA, ignore_errors=True)
    os.makedirs(SECOND_ENGINE_DIR, exist_ok=True)
    config = os.path.join(SECOND_ENGINE_DIR, "daemon.json")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write("{}\n")
    host = f"unix://{SECOND_ENGINE_DIR}/docker.sock"
    log = open(os.path.join(SECOND_ENGINE_DIR, "dockerd.log"), "ab")  # noqa: SIM115 (open while the engine runs)
    dockerd = _shutil.which("dockerd") or "/usr/sbin/dockerd"
    proc = subprocess.Popen(
        ["unshare", "--net", dockerd, "--config-file", config, "--host", host, "--data-root", SECOND_ENGINE_DATA,
         "--exec-root", os.path.join(SECOND_ENGINE_DIR, "exec"), "--pidfile", os.path.join(SECOND_ENGINE_DIR, "pid"),
         "--bridge", "none", "--iptables=false", "--ip6tables=false", "--ip-masq=false"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while docker("info", host=host, check=False, timeout=30).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            with open(os.path.join(SECOND_ENGINE_DIR, "dockerd.log"), encoding="utf-8", errors="replace") as handle:
                pytest.fail(f"the second Docker engine did not answer: {handle.read()[-3000:]}")
        time.sleep(1)
    yield host
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
    _shutil.rmtree(SECOND_ENGINE_DATA, ignore_errors=True)
    _shutil.rmtree(SECOND_ENGINE_DIR, ignore_errors=True)
