"""The edits that make one pinned vLLM release serve the NVFP4 KV cache on GB10, and the tool that applies them.

Each seam names the vLLM source lines it hooks (its anchor, found exactly once) and the lines it puts there. Every
line it adds ends in ``# sparkfleet:<seam>``, so an edited file says what touched it. The edits are applied to the
installed vLLM once, when the image is built (``python -m sparkfleet_vllm apply``), and checked in every
vLLM process when the plugin loads (``check``). Anything unexpected -- another vLLM version, an anchor missing or
found twice, an edit half there, a file that no longer compiles -- is a SeamError that names the seam and the
version found, and nothing is written. Standard library only: it runs where vLLM cannot be imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile

PINNED_VERSION = "0.33.0"
# The tensor-parallel padding seams touch lines that are the same in the lab's CPU build (0.32.0) and the image's
# release, so both carry them: ``apply --padding`` applies these alone to a vLLM that is not the pinned release.
PADDING_VERSIONS = ("0.32.0", PINNED_VERSION)
DTYPE = "sparkfleet_nvfp4"
MARK = "# sparkfleet:"
# The patched lines reach the hooks without an import statement of their own, so an edit can sit inside an
# expression or a class body.
HOOKS = '__import__("sparkfleet_vllm.hooks").hooks'


class SeamError(RuntimeError):
    """A seam that cannot be applied or is not as applied: names the seam, the file and the vLLM version found."""

    def __init__(self, seam: str, path: str, version: str, found: str, fix: str,
                 expected: str = f"vLLM {PINNED_VERSION} with the anchor exactly once") -> None:
        self.seam = seam
        super().__init__(
            f"sparkfleet seam '{seam}' ({path}, vLLM {version}): found {found}; expected {expected}; {fix}")


@dataclasses.dataclass(frozen=True)
class Edit:
    """Lines added at one anchor: ``anchor`` is a run of consecutive source lines (compared without leading and
    trailing whitespace); ``action`` places ``lines`` before or after its last line, or replaces that line, or
    (``check``) adds nothing. Added lines take the indentation of that line plus their own."""

    path: str
    anchor: tuple[str, ...]
    action: str = "check"
    lines: tuple[str, ...] = ()

    def rendered(self, seam: str, indent: str) -> list[str]:
        return [f"{indent}{line}  {MARK}{seam}" for line in self.lines]

    def patched_form(self, seam: str) -> tuple[str, ...]:
        """The stripped lines the anchor becomes once the edit is in."""
        added = tuple(line.strip() + f"  {MARK}{seam}" for line in self.lines)
        head, last = self.anchor[:-1], self.anchor[-1]
        return {"check": self.anchor, "before": head + added + (last,), "after": self.anchor + added,
                "replace": head + added}[self.action]


@dataclasses.dataclass(frozen=True)
class Seam:
    name: str
    why: str
    edits: tuple[Edit, ...]
    # An environment variable that turns a GB10 fix off at run time (value 0); None for the NVFP4 seams, which
    # act only when the sparkfleet_nvfp4 KV dtype is selected, and the padding seams, which act only on a group
    # the serve stage pads (SPARKFLEET_TP_PADDING).
    switch: str | None = None


_PARAMETER = "model_executor/parameter.py"
_MOE = "model_executor/layers/fused_moe/routed_experts.py"
_SHARD = f"loaded_weight = {HOOKS}.shard_source(loaded_weight, "

# Tensor-parallel padding (docs/tp-padding.md): where a rank cuts its shard of a split dimension out of a checkpoint
# tensor, the tensor is first zero-extended to the padded width (hooks.shard_source, a no-op on a group that pads
# nothing), and the vocabulary is padded to a multiple of lcm(64, tp) (hooks.vocab_padding).
PADDING_SEAMS: tuple[Seam, ...] = (
    Seam("tp_pad_linear", "linear layers load the zero rows and columns of padded heads and MLP widths", (
        Edit(_PARAMETER, ("shard_size = self.data.shape[self.output_dim]", "loaded_weight = loaded_weight.narrow("),
             "before", (_SHARD + "self.output_dim, self.tp_rank * shard_size, shard_size)",)),
        Edit(_PARAMETER, ("param_data = self.data", "", "param_data = param_data.narrow(self.output_dim, shard_offset, "
                          "shard_size)", "loaded_weight = loaded_weight.narrow("),
             "before", (_SHARD + "self.output_dim, self.tp_rank * shard_size, shard_size)",)),
        Edit(_PARAMETER, ('shard_id_int = self.tp_rank if shard_id == "q" else self.tp_rank // num_heads',
                          "param_data = param_data.narrow(self.output_dim, shard_offset, shard_size)",
                          "loaded_weight = loaded_weight.narrow("),
             "before", (_SHARD + "self.output_dim, shard_id_int * shard_size, shard_size)",)),
        Edit(_PARAMETER, ("shard_size = self.data.shape[self.input_dim]", "loaded_weight = loaded_weight.narrow("),
             "before", (_SHARD + "self.input_dim, self.tp_rank * shard_size, shard_size)",)),
    )),
    Seam("tp_pad_moe", "routed experts load the zero columns of a padded MoE width (stock would split the unpadded "
         "width unevenly and drop its last columns)", (
             Edit(_MOE, ("# the correct slice.", "tp_size = self.moe_config.moe_parallel_config.tp_size"),
                  "before", (_SHARD + "shard_dim, tp_rank * shard_size, shard_size)",)),
             Edit(_MOE, ("# Same padding fix as _load_w13: use unpadded per-rank size.",
                         "tp_size = self.moe_config.moe_parallel_config.tp_size"),
                  "before",
                  (_SHARD + "shard_dim, tp_rank * expert_data.shape[shard_dim], expert_data.shape[shard_dim])",)),
         )),
    Seam("tp_pad_vocab", "the vocabulary is padded to a multiple of lcm(64, tp), so that it splits evenly", (
        Edit("model_executor/layers/vocab_parallel_embedding.py", ("self.padding_size = padding_size",), "replace",
             (f"self.padding_size = {HOOKS}.vocab_padding(padding_size, self.tp_size)",)),
    )),
)

_SM120 = "v1/attention/backends/mla/flashinfer_mla_sparse_sm120.py"
_SM120_BACKEND = "v1/attention/backends/mla/flashinfer_mla_sparse.py"

SEAMS: tuple[Seam, ...] = (
    Seam("version", "the seams below are written against this release only", (
        Edit("_version.py", (f"__version__ = version = '{PINNED_VERSION}'",)),)),
    Seam("kv_dtype", f"'{DTYPE}' is registered through vLLM's KV-cache dtype API when the plugin loads", (
        Edit("config/cache.py", ("def register_kv_cache_dtype(name: str):",)),
        Edit("config/cache.py", ("STR_DTYPE_TO_TORCH_DTYPE[name] = inst.torch_dtype()",)),
        Edit("v1/kv_cache_interface.py", ("handler = get_kv_cache_dtype_handler(kv_cache_dtype)",)),
    )),
    Seam("spec_bytes", "MLA pages sized at 288 B/token for the NVFP4 dtype; otherwise the pool is budgeted at 512 B", (
        Edit("model_executor/layers/attention/mla_attention.py",
             ('state_content_bytes={"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}.get(',), "replace",
             (f'state_content_bytes={{"fp8_ds_mla": 656, "nvfp4_ds_mla": 352, **{HOOKS}.STATE_BYTES}}.get(',)),
        # The hybrid (KDA) block-size alignment builds its own one-token MLA spec: give it the same row size.
        Edit("platforms/interface.py",
             ("attn_page_size_1_token = MLAAttentionSpec(", "block_size=1,",
              "num_kv_heads=model_config.get_num_kv_heads(parallel_config),",
              "head_size=model_config.get_head_size(),", "dtype=kv_cache_dtype,",
              "cache_dtype_str=cache_config.cache_dtype,"), "after",
             (f"state_content_bytes={HOOKS}.STATE_BYTES.get(cache_config.cache_dtype),",)),
    )),
    Seam("sm120_admit", "the SM120 sparse-MLA backend accepts the NVFP4 dtype at its three gates", (
        Edit(_SM120_BACKEND, ('"fp8_ds_mla",', "]"), "before", (f"    {HOOKS}.DTYPE,",)),
        Edit(_SM120_BACKEND, ("if kv_cache_dtype not in (",), "replace",
             (f"if kv_cache_dtype != {HOOKS}.DTYPE and kv_cache_dtype not in (",)),
        Edit(_SM120, ('if kv_cache_dtype != "fp8_ds_mla":',), "replace",
             (f'if kv_cache_dtype not in ("fp8_ds_mla", {HOOKS}.DTYPE):',)),
    )),
    Seam("write", "the cache write quantises to 288-byte NVFP4 rows (the stock op needs 656-byte rows)", (
        Edit("v1/attention/backend.py", ("ops.concat_and_cache_mla(",), "before",
             (f"if {HOOKS}.write(kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype):", "    return")),
    )),
    Seam("read", "the top-k rows are gathered into fp8_ds_mla scratch pages before the SM120 kernel reads them", (
        Edit(_SM120, ("sparse_capacity = topk_indices_physical.shape[1]",), "before",
             (f"kv_cache, topk_indices_physical = {HOOKS}.mqa_inputs(self, kv_cache, topk_indices_physical)",)),
    )),
    Seam("uma_free_memory",
         "on unified memory the startup free-memory check is a warning with the measured figures, not an error: "
         "page cache and the kernel's watermarks keep MemAvailable under the utilisation target on a healthy node", (
             Edit("v1/worker/utils.py", ("if init_snapshot.free_memory < requested_memory:",), "replace",
                  ("if init_snapshot.free_memory < requested_memory and not "
                   f"{HOOKS}.uma_startup_ok(init_snapshot, cache_config, requested_memory):",)),
         ), switch="SPARKFLEET_UMA_FREE_MEMORY_WARN"),
    Seam("pdl_sm9_10",
         "programmatic dependent launch only on SM 9.x and 10.x, as the community's GB10 images do: 0.33.0 "
         "enables it on every major >= 9, GB10 (SM 12.1) included", (
             Edit("platforms/cuda.py", ("return major >= 9",), "replace",
                  (f"return major >= 9 and {HOOKS}.pdl_allowed(major)",)),
         ), switch="SPARKFLEET_PDL_SM9_10_ONLY"),
    *PADDING_SEAMS,
)


def _strip(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines]


def _find(stripped: list[str], block: tuple[str, ...]) -> list[int]:
    """Start indexes where the block of stripped lines occurs."""
    size = len(block)
    return [i for i in range(len(stripped) - size + 1) if tuple(stripped[i:i + size]) == block]


def vllm_version(vllm_dir: str) -> str:
    try:
        with open(os.path.join(vllm_dir, "_version.py"), encoding="utf-8") as handle:
            match = re.search(r"^__version__ = version = '([^']*)'", handle.read(), re.M)
    except OSError:
        match = None
    return match.group(1) if match else "unknown"


def _state(seam: Seam, edit: Edit, stripped: list[str], version: str) -> str:
    """'applied' or 'pending' for one edit in a file's stripped lines; anything else raises."""
    patched = _find(stripped, edit.patched_form(seam.name))
    anchored = _find(stripped, edit.anchor)
    marked = any(line.endswith(MARK + seam.name) for line in stripped)
    # An insertion keeps a one-line anchor and splits a longer one; a replacement removes it.
    if edit.action == "check":
        if len(anchored) == 1:
            return "applied"
    elif len(patched) == 1 and len(anchored) <= (0 if edit.action == "replace" else 1):
        return "applied"
    elif not patched and len(anchored) == 1 and not marked:
        return "pending"
    if patched or marked:
        found = f"the edit {len(patched)} times and the anchor {len(anchored)} times"
        fix = "rebuild the image from an unmodified vLLM"
    else:
        found = f"the anchor {edit.anchor[-1]!r} {len(anchored)} times"
        fix = ("port the seam to this release (docs/vllm-0.33-seams.md maps them) or pin vLLM "
               f"{PINNED_VERSION} again")
    raise SeamError(seam.name, edit.path, version, found, fix)


def _files(seams: tuple[Seam, ...]) -> dict[str, list[tuple[Seam, Edit]]]:
    files: dict[str, list[tuple[Seam, Edit]]] = {}
    for seam in seams:
        for edit in seam.edits:
            files.setdefault(edit.path, []).append((seam, edit))
    return files


def _read(vllm_dir: str, seam: Seam, path: str, version: str) -> list[str]:
    try:
        with open(os.path.join(vllm_dir, path), encoding="utf-8") as handle:
            return handle.read().splitlines(keepends=True)
    except OSError as exc:
        raise SeamError(seam.name, path, version, f"no readable file ({exc.strerror})",
                        f"point at the vllm package directory of vLLM {PINNED_VERSION}", "the file") from None


def _versions(seams: tuple[Seam, ...]) -> tuple[str, ...]:
    """The releases a set of seams is written against: the padding seams' alone, else the pinned release."""
    return PADDING_VERSIONS if all(seam in PADDING_SEAMS for seam in seams) else (PINNED_VERSION,)


def _check_version(version: str, seams: tuple[Seam, ...]) -> None:
    versions = _versions(seams)
    if version not in versions:
        raise SeamError("version", "_version.py", version, f"version {version}",
                        f"build the image FROM a vLLM {PINNED_VERSION} base, or port the seams to {version}",
                        f"vLLM {' or '.join(versions)}")


def check(vllm_dir: str, seams: tuple[Seam, ...] = SEAMS) -> dict[str, str]:
    """Each seam's state in an installed vLLM: 'applied' or 'pending'; a drifted or half-applied seam raises."""
    version = vllm_version(vllm_dir)
    _check_version(version, seams)
    states: dict[str, str] = {}
    for path, edits in _files(seams).items():
        stripped = _strip(_read(vllm_dir, edits[0][0], path, version))
        for seam, edit in edits:
            state = _state(seam, edit, stripped, version)
            states[seam.name] = "pending" if "pending" in (state, states.get(seam.name)) else state
    return states


def _apply_edit(seam: Seam, edit: Edit, lines: list[str], version: str) -> list[str]:
    found = _find(_strip(lines), edit.anchor)
    if len(found) != 1:
        raise SeamError(seam.name, edit.path, version, "its anchor changed by another seam's edit",
                        "give the two seams anchors that do not overlap")
    start = found[0]
    target = start + len(edit.anchor) - 1
    line = lines[target]
    indent = line[: len(line) - len(line.lstrip())]
    newline = "\n" if line.endswith("\n") else ""
    added = [text + "\n" for text in edit.rendered(seam.name, indent)]
    if edit.action == "before":
        return lines[:target] + added + lines[target:]
    if edit.action == "after":
        return lines[: target + 1] + added + lines[target + 1:]
    added[-1] = added[-1][:-1] + newline
    return lines[:target] + added + lines[target + 1:]


def patch(vllm_dir: str, seams: tuple[Seam, ...] = SEAMS) -> dict[str, str]:
    """The edited text of every file with a pending edit (nothing is written); {} when all are applied."""
    version = vllm_version(vllm_dir)
    _check_version(version, seams)
    texts: dict[str, str] = {}
    for path, edits in _files(seams).items():
        lines = _read(vllm_dir, edits[0][0], path, version)
        stripped = _strip(lines)
        states = [_state(seam, edit, stripped, version) for seam, edit in edits]
        if "pending" not in states:
            continue
        for (seam, edit), state in zip(edits, states, strict=True):
            if state != "pending":
                continue
            lines = _apply_edit(seam, edit, lines, version)
            try:
                compile("".join(lines), os.path.join(vllm_dir, path), "exec")
            except SyntaxError as exc:
                raise SeamError(seam.name, path, version, f"an edited file that does not compile ({exc.msg}, line "
                                f"{exc.lineno})", "fix the seam's lines", "Python that compiles") from None
        texts[path] = "".join(lines)
    return texts


def apply(vllm_dir: str, seams: tuple[Seam, ...] = SEAMS) -> list[str]:
    """Apply every pending edit; returns the files written. All files are checked and compiled before any is
    written, so a drifted seam leaves the installation as it was. Applying twice writes nothing."""
    texts = patch(vllm_dir, seams)
    for path, text in texts.items():
        target = os.path.join(vllm_dir, path)
        mode = os.stat(target).st_mode & 0o7777
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".sparkfleet-")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
        # A stale bytecode cache would still hold the unedited module where the source's mtime did not move.
        cache = os.path.join(os.path.dirname(target), "__pycache__")
        stem = os.path.splitext(os.path.basename(target))[0] + "."
        for name in os.listdir(cache) if os.path.isdir(cache) else ():
            if name.startswith(stem):
                os.remove(os.path.join(cache, name))
    return sorted(texts)


def find_vllm() -> str:
    """The installed vllm package directory, found without importing vLLM."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"no vllm package on this Python's path; expected vLLM {PINNED_VERSION}")
    return next(iter(spec.submodule_search_locations))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("action", choices=("apply", "check", "list"))
    parser.add_argument("--vllm-dir", help="the vllm package directory (default: the installed one)")
    parser.add_argument("--padding", action="store_true",
                        help=f"the tensor-parallel padding seams alone (vLLM {' or '.join(PADDING_VERSIONS)})")
    args = parser.parse_args(argv)
    chosen = PADDING_SEAMS if args.padding else SEAMS
    if args.action == "list":
        for seam in chosen:
            print(f"{seam.name:16} {seam.switch or '-':34} {seam.why}")
        return 0
    vllm_dir = args.vllm_dir or find_vllm()
    version = vllm_version(vllm_dir)
    try:
        if args.action == "apply":
            written = apply(vllm_dir, chosen)
            print(f"vLLM {version} at {vllm_dir}: {len(chosen)} seams applied; "
                  f"{len(written)} files written{': ' + ', '.join(written) if written else ''}")
        states = check(vllm_dir, chosen)
    except SeamError as exc:
        print(exc, file=sys.stderr)
        return 1
    pending = sorted(name for name, state in states.items() if state != "applied")
    if pending:
        print(f"vLLM {version} at {vllm_dir}: seams not applied: {', '.join(pending)}", file=sys.stderr)
        return 1
    print(f"vLLM {version} at {vllm_dir}: every seam in place ({', '.join(states)})")
    return 0
