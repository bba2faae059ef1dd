"""sparkfleet's vLLM plugin: the NVFP4 KV cache (288-byte MLA rows) and the GB10 fixes for one pinned vLLM release.

vLLM calls ``register`` in every process it starts (API server, engine core, each worker), through the
``vllm.general_plugins`` entry point this package installs. The source edits themselves are made once, when the
image is built (``python -m sparkfleet_vllm apply``); here each process checks that the running vLLM is the
pinned release with every seam in place, then registers the KV dtype ``sparkfleet_nvfp4``.

Fail closed, inert otherwise: when a check fails, the dtype is registered as a tripwire whose first use raises the
seam's error, so an engine that selects it stops before it allocates a cache, while one that selects a stock
dtype starts (with a logged error): the NVFP4 hooks hand stock dtypes their inputs untouched, and only the GB10
fixes (hooks.py, each behind its switch) still act. Registering twice in one process does nothing.
"""

from __future__ import annotations

import logging

from .seams import DTYPE, PINNED_VERSION, SeamError, check, find_vllm

__all__ = ["DTYPE", "PINNED_VERSION", "SeamError", "problem", "register"]

logger = logging.getLogger("vllm.sparkfleet")

# The outcome of this process's checks: None when every seam is in place, else the error.
_problem: SeamError | None = None
_registered = False


def problem() -> SeamError | None:
    """Why the NVFP4 dtype is unavailable in this process, or None."""
    return _problem


def _handler_class(error: SeamError | None):
    import torch
    from vllm.v1.kv_cache_interface import KVQuantMode

    class NVFP4Handler:
        """288-byte NVFP4 MLA rows, stored as uint8 pages; the backend dispatches its own kernels."""

        name = DTYPE
        sparkfleet = True

        def torch_dtype(self):
            return torch.uint8

        def quant_mode(self):
            if error is not None:
                raise error
            # Quantised, with no generic kernel path (vLLM's CUSTOM, which 0.33.0 aliases to value 12).
            return KVQuantMode.CUSTOM

    return NVFP4Handler


def register() -> None:
    """The vLLM plugin entry point. Never raises: vLLM calls it unguarded in every process, stock ones included."""
    global _problem, _registered
    if _registered:
        return
    _registered = True
    try:
        from vllm.config import cache
    except Exception as exc:  # an import failure of vLLM itself is vLLM's to report
        logger.error("sparkfleet: vllm.config.cache does not import (%s); --kv-cache-dtype %s is not available",
                     exc, DTYPE)
        return
    if not hasattr(cache, "register_kv_cache_dtype"):
        import vllm

        _problem = SeamError("kv_dtype", "config/cache.py", getattr(vllm, "__version__", "unknown"),
                             "no register_kv_cache_dtype", f"use vLLM {PINNED_VERSION}",
                             "vLLM's KV-cache dtype registration API")
        logger.error("%s; --kv-cache-dtype %s is not available", _problem, DTYPE)
        return
    existing = cache.get_kv_cache_dtype_handler(DTYPE)
    if existing is not None and getattr(existing, "sparkfleet", False):
        return
    try:
        states = check(find_vllm())
        pending = sorted(name for name, state in states.items() if state != "applied")
        if pending:
            raise SeamError(pending[0], "vllm", PINNED_VERSION, "the seam not applied to this installation",
                            "build the image with `python -m sparkfleet_vllm apply`", "every seam applied")
    except SeamError as exc:
        _problem = exc
    except Exception as exc:  # any other surprise while checking fails closed the same way
        _problem = SeamError("check", "vllm", "unknown", f"{type(exc).__name__}: {exc}",
                             "report it with the image's fingerprint", "readable vLLM sources")
    if _problem is not None:
        logger.error("%s; --kv-cache-dtype %s will refuse to start; stock dtypes run without the NVFP4 hooks",
                     _problem, DTYPE)
    try:
        cache.register_kv_cache_dtype(DTYPE)(_handler_class(_problem))
    except Exception as exc:
        logger.error("sparkfleet: registering --kv-cache-dtype %s failed (%s: %s); it is not available",
                     DTYPE, type(exc).__name__, exc)
        return
    if _problem is None:
        logger.info("sparkfleet: vLLM %s, every seam in place; --kv-cache-dtype %s available", PINNED_VERSION, DTYPE)
