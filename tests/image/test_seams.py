"""The seams against vLLM 0.33.0's own files, taken from its wheel: anchors, edits, idempotence, fail-closed drift."""

import os
import re

import pytest
from sparkfleet_vllm import hooks, seams

SEAM_NAMES = [seam.name for seam in seams.SEAMS]
EDITING = [seam for seam in seams.SEAMS if any(edit.action != "check" for edit in seam.edits)]


def read(vllm_dir, path):
    with open(os.path.join(vllm_dir, path), encoding="utf-8") as handle:
        return handle.read()


def write(vllm_dir, path, text):
    with open(os.path.join(vllm_dir, path), "w", encoding="utf-8") as handle:
        handle.write(text)


def snapshot(vllm_dir):
    return {path: read(vllm_dir, path) for path in {e.path for s in seams.SEAMS for e in s.edits}}


def test_the_wheel_is_the_pinned_release(vllm_pristine):
    assert seams.vllm_version(vllm_pristine) == "0.33.0"


@pytest.mark.parametrize("seam", seams.SEAMS, ids=SEAM_NAMES)
def test_every_anchor_is_found_exactly_once(vllm_pristine, seam):
    for edit in seam.edits:
        stripped = [line.strip() for line in read(vllm_pristine, edit.path).splitlines()]
        assert len(seams._find(stripped, edit.anchor)) == 1, (seam.name, edit.path, edit.anchor)


def test_the_pristine_release_has_every_edit_pending(vllm_copy):
    states = seams.check(vllm_copy)
    assert set(states) == set(SEAM_NAMES)
    assert {name for name, state in states.items() if state == "pending"} == {s.name for s in EDITING}


def test_apply_edits_compiles_and_checks(vllm_copy):
    before = snapshot(vllm_copy)
    written = seams.apply(vllm_copy)
    after = snapshot(vllm_copy)
    assert written == sorted(path for path in before if before[path] != after[path])
    assert len(written) == 10
    for path in written:
        compile(after[path], path, "exec")
    assert set(seams.check(vllm_copy).values()) == {"applied"}
    # Every added line carries its seam's marker, and each edit adds exactly its lines.
    for seam in EDITING:
        for edit in seam.edits:
            marked = [line for line in after[edit.path].splitlines() if line.endswith(seams.MARK + seam.name)]
            assert len(marked) >= len(edit.lines)


def test_applying_twice_changes_nothing(vllm_copy):
    seams.apply(vllm_copy)
    once = snapshot(vllm_copy)
    mtimes = {path: os.stat(os.path.join(vllm_copy, path)).st_mtime_ns for path in once}
    assert seams.apply(vllm_copy) == []
    assert snapshot(vllm_copy) == once
    assert {path: os.stat(os.path.join(vllm_copy, path)).st_mtime_ns for path in once} == mtimes


def test_patched_lines_name_hooks_that_exist(vllm_copy):
    seams.apply(vllm_copy)
    called = set()
    for text in snapshot(vllm_copy).values():
        called |= set(re.findall(re.escape(seams.HOOKS) + r"\.(\w+)", text))
    assert called == {"STATE_BYTES", "DTYPE", "write", "mqa_inputs", "uma_startup_ok", "pdl_allowed",
                      "shard_source", "vocab_padding"}
    for name in called:
        assert hasattr(hooks, name), name
    assert hooks.STATE_BYTES == {"sparkfleet_nvfp4": 288}


def test_the_edits_sit_where_they_act(vllm_copy):
    seams.apply(vllm_copy)
    sm120 = read(vllm_copy, "v1/attention/backends/mla/flashinfer_mla_sparse_sm120.py")
    # The read hook runs before the FlashInfer call reads kv_cache and the tables.
    assert sm120.index("hooks.mqa_inputs(self, kv_cache, topk_indices_physical)") < sm120.index(
        "kv_cache=kv_cache.view(torch.uint8).unsqueeze(1),")
    backend = read(vllm_copy, "v1/attention/backend.py")
    hook = backend.index("hooks.write(kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype)")
    assert backend.index("def do_kv_cache_update(") < hook < backend.index("ops.concat_and_cache_mla(")
    # The SM120 backend's list of KV dtypes gained ours, inside the SM120 class.
    listing = read(vllm_copy, "v1/attention/backends/mla/flashinfer_mla_sparse.py")
    sm120_class = listing.index("class FlashInferMLASparseSM120Backend")
    assert listing.index("hooks.DTYPE,  # sparkfleet:sm120_admit") > sm120_class


EDITS = [(seam, edit) for seam in EDITING for edit in seam.edits if edit.action != "check"]


@pytest.mark.parametrize("seam,edit", EDITS, ids=[f"{s.name}-{i}" for i, (s, _edit) in enumerate(EDITS)])
def test_a_drifted_anchor_fails_closed_naming_the_seam(vllm_copy, seam, edit):
    lines = read(vllm_copy, edit.path).splitlines(keepends=True)
    last = seams._find([line.strip() for line in lines], edit.anchor)[0] + len(edit.anchor) - 1
    lines[last] = lines[last].rstrip("\n") + "  # upstream moved this\n"
    write(vllm_copy, edit.path, "".join(lines))
    before = snapshot(vllm_copy)
    with pytest.raises(seams.SeamError) as raised:
        seams.apply(vllm_copy)
    assert raised.value.seam == seam.name
    assert f"sparkfleet seam '{seam.name}' ({edit.path}, vLLM 0.33.0)" in str(raised.value)
    assert "0 times" in str(raised.value)
    assert snapshot(vllm_copy) == before, "a drifted seam must leave every file as it was"


def test_an_anchor_found_twice_fails_closed(vllm_copy):
    path = "v1/worker/utils.py"
    text = read(vllm_copy, path)
    write(vllm_copy, path, text + "\ndef _copy(init_snapshot, requested_memory):\n"
          "    if init_snapshot.free_memory < requested_memory:\n        pass\n")
    with pytest.raises(seams.SeamError, match=r"'uma_free_memory'.*the anchor .* 2 times"):
        seams.apply(vllm_copy)


def test_a_bumped_pin_fails_closed_with_the_version_seam(vllm_copy):
    path = "_version.py"
    write(vllm_copy, path, read(vllm_copy, path).replace("'0.33.0'", "'0.34.0'"))
    before = snapshot(vllm_copy)
    with pytest.raises(seams.SeamError) as raised:
        seams.apply(vllm_copy)
    assert raised.value.seam == "version"
    assert "vLLM 0.34.0" in str(raised.value) and "expected vLLM 0.33.0" in str(raised.value)
    assert snapshot(vllm_copy) == before
    with pytest.raises(seams.SeamError, match="'version'"):
        seams.check(vllm_copy)


def test_a_half_applied_seam_is_refused(vllm_copy):
    seams.apply(vllm_copy)
    path = "v1/attention/backends/mla/flashinfer_mla_sparse.py"
    text = read(vllm_copy, path)
    edited = next(line for line in text.splitlines() if "kv_cache_dtype not in (  # sparkfleet:sm120_admit" in line)
    indent = edited[: len(edited) - len(edited.lstrip())]
    write(vllm_copy, path, text.replace(edited, indent + "if kv_cache_dtype not in ("))
    with pytest.raises(seams.SeamError, match=r"'sm120_admit'.*rebuild the image from an unmodified vLLM"):
        seams.check(vllm_copy)


def test_an_edit_that_does_not_compile_writes_nothing(vllm_copy, monkeypatch):
    broken = seams.Seam("broken", "a test seam whose line is not Python", (
        seams.Edit("v1/worker/utils.py", ("def request_memory(",), "before", ("def broken(:",)),))
    before = snapshot(vllm_copy)
    with pytest.raises(seams.SeamError, match=r"'broken'.*does not compile"):
        seams.apply(vllm_copy, (*seams.SEAMS, broken))
    assert snapshot(vllm_copy) == before


def test_the_command_line_reports_and_fails_closed(vllm_copy, capsys):
    assert seams.main(["check", "--vllm-dir", vllm_copy]) == 1
    assert "seams not applied" in capsys.readouterr().err
    assert seams.main(["apply", "--vllm-dir", vllm_copy]) == 0
    assert f"{len({e.path for s in EDITING for e in s.edits if e.action != 'check'})} files written" in \
        capsys.readouterr().out
    assert seams.main(["apply", "--vllm-dir", vllm_copy]) == 0
    assert "0 files written" in capsys.readouterr().out
    path = os.path.join(vllm_copy, "_version.py")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text.replace("'0.33.0'", "'0.33.1'"))
    assert seams.main(["check", "--vllm-dir", vllm_copy]) == 1
    assert "sparkfleet seam 'version' (_version.py, vLLM 0.33.1)" in capsys.readouterr().err


def test_the_padding_seams_alone_fit_the_labs_cpu_release_and_the_rest_refuse_it(vllm_copy, capsys):
    """The lab's vLLM (the CPU build 0.32.0) gets the padding seams alone: its lines are the same as 0.33.0's there,
    and the NVFP4 and GB10 seams stay refused on it, naming the version."""
    path = os.path.join(vllm_copy, "_version.py")
    write(vllm_copy, "_version.py", read(vllm_copy, "_version.py").replace("'0.33.0'", "'0.32.0'"))
    with pytest.raises(seams.SeamError, match=r"'version'.*found version 0.32.0"):
        seams.check(vllm_copy)
    assert seams.main(["apply", "--padding", "--vllm-dir", vllm_copy]) == 0
    out = capsys.readouterr().out
    assert "vLLM 0.32.0" in out and "3 seams applied; 3 files written" in out
    assert "every seam in place (tp_pad_linear, tp_pad_moe, tp_pad_vocab)" in out
    assert seams.main(["apply", "--padding", "--vllm-dir", vllm_copy]) == 0
    assert "0 files written" in capsys.readouterr().out
    assert os.path.exists(path)
    write(vllm_copy, "_version.py", read(vllm_copy, "_version.py").replace("'0.32.0'", "'0.31.0'"))
    assert seams.main(["check", "--padding", "--vllm-dir", vllm_copy]) == 1
    assert "expected vLLM 0.32.0 or 0.33.0" in capsys.readouterr().err
