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

import hashlib
import importlib.util
import marshal
import os
import sys
import zipimport

CACHE = "/var/cache/sparkfleet-lab-zipcache"


def _renamed(code, filename):
    """The code object (and every one nested in it) recorded as compiled from filename."""
    consts = tuple(_renamed(const, filename) if isinstance(const, type(code)) else const for const in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _key(source):
    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    digest.update(bytes([sys.flags.optimize]))
    digest.update(source if isinstance(source, bytes) else source.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def cached_compile(compile_source, cache, pathname, source):
    """compile_source(pathname, source), or the code compiled from the same source before, from the cache."""
    path = os.path.join(cache, _key(source))
    try:
        with open(path, "rb") as handle:
            code = marshal.load(handle)
        return _renamed(code, pathname) if code.co_filename != pathname else code
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = compile_source(pathname, source)
    try:
        os.makedirs(cache, mode=0o700, exist_ok=True)
        temporary = f"{path}.{os.getpid()}"
        with open(temporary, "wb") as handle:
            marshal.dump(code, handle)
        os.replace(temporary, path)
    except OSError:
        pass
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
