# Lab nodes only (installed by the lab role, never by a sparkfleet role on a real node): a bytecode cache for the
# Python sources that zipimport compiles.
#
# Every Ansible module run on a node imports ansible.module_utils from the AnsiballZ zip the controller sends, and
# zipimport keeps no bytecode for a zip: it compiles basic.py and the rest from source on every run, the largest
# part of a module run's CPU on a node. The lab's nodes share one machine's CPUs with the tests, so the lab keeps
# the compiled code of each source it has seen, keyed by the source's bytes (and the interpreter's bytecode magic
# and optimisation level), and loads it instead of compiling again. The code is the same as compile() gives: only
# the file name recorded in it is set to the zip the source came from this time, as compile() would set it.
# Python has no switch for this and no maintained package does it for zipimport; it is a few lines on
# zipimport's own compile step, used only by root (the cache directory is root's, mode 0700) and only where that
# step exists. Any failure of the cache falls back to compiling.
"""Cache zipimport's compiled sources on a lab node (installed at interpreter start by a .pth file's line)."""

# Only what the interpreter has loaded at its start anyway: every python3 on a lab node runs this file's
# install(), and the cache's own imports (hashlib, tempfile) wait until zipimport compiles something.
import marshal
import os
import sys
import types
import zipimport

CACHE = "/var/cache/sparkfleet-lab-zipcache"


def _renamed(code, filename):
    """The code object (and every one nested in it) recorded as compiled from filename."""
    consts = tuple(_renamed(const, filename) if isinstance(const, types.CodeType) else const
                   for const in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _key(source):
    import hashlib  # pylint: disable=import-outside-toplevel
    import importlib.util  # pylint: disable=import-outside-toplevel

    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    digest.update(f"-O{sys.flags.optimize}:".encode("ascii"))
    digest.update(source if isinstance(source, bytes) else source.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _load(path, pathname):
    """The cached code at path under pathname's name, or None (no entry, or one that is not code)."""
    try:
        with open(path, "rb") as handle:
            code = marshal.load(handle)
    except FileNotFoundError:
        return None
    if not isinstance(code, types.CodeType):
        raise TypeError(f"{path} holds no code object")
    return _renamed(code, pathname) if code.co_filename != pathname else code


def _store(cache, path, code):
    """Write code to path through a temporary file of its own, renamed into place."""
    import tempfile  # pylint: disable=import-outside-toplevel

    os.makedirs(cache, mode=0o700, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=cache, prefix=".new-")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            marshal.dump(code, handle)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def cached_compile(compile_source, cache, pathname, source):
    """compile_source(pathname, source), or the code compiled from the same source before, from the cache. The
    cache never decides the outcome: whatever goes wrong with it (a damaged entry, a full or unwritable disk), the
    source is compiled as zipimport would."""
    try:
        path = os.path.join(cache, _key(source))
        code = _load(path, pathname)
        if code is not None:
            return code
    except Exception:  # pylint: disable=broad-exception-caught
        path = None
    code = compile_source(pathname, source)
    if path is not None:
        try:
            _store(cache, path, code)
        except Exception:  # pylint: disable=broad-exception-caught
            return code
    return code


def install(cache=CACHE):
    """Put the cache in front of zipimport's compile step, for root only; returns whether it did."""
    compile_source = getattr(zipimport, "_compile_source", None)
    if compile_source is None or getattr(compile_source, "sparkfleet_lab_zipcache", False) or os.geteuid() != 0:
        return False

    def compile_cached(pathname, source):
        return cached_compile(compile_source, cache, pathname, source)

    compile_cached.sparkfleet_lab_zipcache = True
    zipimport._compile_source = compile_cached  # pylint: disable=protected-access
    return True
