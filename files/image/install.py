"""Install sparkfleet's vLLM plugin and NVFP4 kernels into an image's Python, apply the seams and check the result.

Run by the Dockerfile with the image's own Python (the one vLLM runs with); also prints the fingerprint of an
image context for the role that labels the build (``--print-fingerprint``). Standard library only.

The fingerprint is a SHA-256 over the base image digest, the pinned vLLM version and every source file of the
plugin, the kernels and this directory (path and content; bytecode and Markdown excluded): two images with the same
fingerprint run the same code. The install refuses a fingerprint argument that does not match what it was given
to install, so the label never lies about the content.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys

PACKAGES = ("sparkfleet_nvfp4", "sparkfleet_vllm")
CONTEXT_DIRS = (*PACKAGES, "image")
DIST_NAME = "sparkfleet_vllm_plugin"
ENTRY_POINT = "sparkfleet = sparkfleet_vllm:register"
IMPORT_CHECKS = ("sparkfleet_vllm", "sparkfleet_vllm.hooks", "sparkfleet_nvfp4.layout")
# These need torch and Triton, which every vLLM base carries.
TORCH_IMPORT_CHECKS = ("sparkfleet_nvfp4.reference", "sparkfleet_nvfp4.kernels")


def _sources(context: str) -> list[str]:
    """Context-relative paths of the files the fingerprint covers, sorted."""
    found = []
    for top in CONTEXT_DIRS:
        for root, dirs, files in os.walk(os.path.join(context, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in files:
                if not name.endswith((".pyc", ".md")):
                    found.append(os.path.relpath(os.path.join(root, name), context))
    return sorted(found)


def fingerprint(context: str, base_digest: str, vllm_version: str, python: str = "python3",
                require_torch: int = 1) -> str:
    """The image's identity: base, vLLM version, the Dockerfile's arguments and every source file."""
    digest = hashlib.sha256(f"base {base_digest}\nvllm {vllm_version}\npython {python}\n"
                            f"require_torch {require_torch}\n".encode())
    for path in _sources(context):
        with open(os.path.join(context, path), "rb") as handle:
            digest.update(f"{path} {hashlib.sha256(handle.read()).hexdigest()}\n".encode())
    return digest.hexdigest()


def _write_dist_info(site: str, version: str, installed: list[str]) -> None:
    """A minimal installed distribution: what importlib.metadata needs to find the vLLM entry point."""
    info = os.path.join(site, f"{DIST_NAME}-{version}.dist-info")
    shutil.rmtree(info, ignore_errors=True)
    os.makedirs(info)
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {version}\n"
                    "Summary: sparkfleet's NVFP4 KV cache and GB10 fixes for vLLM\n",
        "entry_points.txt": f"[vllm.general_plugins]\n{ENTRY_POINT}\n",
        "INSTALLER": "sparkfleet\n",
    }
    for name, text in files.items():
        with open(os.path.join(info, name), "w", encoding="utf-8") as handle:
            handle.write(text)
    record = [f"{path},," for path in installed] + [
        f"{os.path.basename(info)}/{name},," for name in (*files, "RECORD")]
    with open(os.path.join(info, "RECORD"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(record) + "\n")


def install_packages(context: str, site: str, version: str) -> None:
    """The two packages copied into a site directory, with the dist-info that names the vLLM entry point."""
    installed = []
    for package in PACKAGES:
        target = os.path.join(site, package)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(os.path.join(context, package), target,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.md"))
        installed += [os.path.relpath(os.path.join(root, name), site)
                      for root, _dirs, names in os.walk(target) for name in sorted(names)]
    _write_dist_info(site, version, installed)
    print(f"installed {', '.join(PACKAGES)} into {site} with the vllm.general_plugins entry point '{ENTRY_POINT}'")


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{what} failed (exit {proc.returncode}); the image is not usable as built")


def _import_checks(require_torch: bool) -> tuple[str, ...]:
    if require_torch or importlib.util.find_spec("torch") is not None:
        return IMPORT_CHECKS + TORCH_IMPORT_CHECKS
    print(f"no torch in this base and REQUIRE_TORCH=0: {', '.join(TORCH_IMPORT_CHECKS)} not imported")
    return IMPORT_CHECKS


def install(context: str, expected: str, base_digest: str, vllm_version: str, python: str = "python3",
            require_torch: bool = True) -> None:
    actual = fingerprint(context, base_digest, vllm_version, python, int(require_torch))
    if actual != expected:
        raise SystemExit(f"found fingerprint {actual} for this context; the build was labelled {expected or '(none)'};"
                         " pass the fingerprint that `install.py --print-fingerprint` prints for this context")
    # The plugin's own lookup of the base's vLLM (standard library only, so it runs before the install).
    sys.path.insert(0, context)
    from sparkfleet_vllm.seams import find_vllm

    site = os.path.dirname(find_vllm())
    install_packages(context, site, f"0+{actual[:12]}")
    # The seams, against the base image's own vLLM: applied, then checked as the plugin will check them.
    _run([sys.executable, "-m", "sparkfleet_vllm", "apply"], "applying the seams")
    # Import-time checks, in a fresh interpreter: the packages import and the entry point is visible.
    code = ("import importlib, importlib.metadata as m\n"
            f"for name in {_import_checks(require_torch)!r}: importlib.import_module(name)\n"
            "eps = [e for e in m.entry_points(group='vllm.general_plugins') if e.value == 'sparkfleet_vllm:register']\n"
            "assert len(eps) == 1, f'expected one sparkfleet entry point, found {eps}'\n"
            "import sparkfleet_vllm.seams as s\n"
            f"found = s.vllm_version(s.find_vllm())\n"
            f"assert found == {vllm_version!r}, f'the base runs vLLM {{found}}; the image is labelled {vllm_version}'\n"
            "print('imports, entry point and vLLM version: ok')\n")
    _run([sys.executable, "-c", code], "the import checks")
    with open(os.path.join(site, "sparkfleet_vllm", "IMAGE"), "w", encoding="utf-8") as handle:
        handle.write(f"fingerprint={actual}\nvllm={vllm_version}\nbase={base_digest}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--context", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--base-digest", required=True)
    parser.add_argument("--vllm-version", required=True)
    parser.add_argument("--fingerprint", default="", help="the fingerprint the image is labelled with")
    parser.add_argument("--print-fingerprint", action="store_true")
    parser.add_argument("--python", default="python3", help="the Dockerfile's PYTHON argument (fingerprinted)")
    parser.add_argument("--require-torch", type=int, choices=(0, 1), default=1,
                        help="0 lets a stand-in base without torch pass the import checks of the other modules")
    args = parser.parse_args(argv)
    if args.print_fingerprint:
        print(fingerprint(args.context, args.base_digest, args.vllm_version, args.python, args.require_torch))
        return 0
    install(args.context, args.fingerprint, args.base_digest, args.vllm_version, args.python,
            bool(args.require_torch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
