"""What the serve stage writes for a GB10 rank (docker runtime), rendered from the spark2 example inventory.

GB10 hardware cannot exist here, so these files are checked as text: the flags the field needs, per rank.
"""

import json
import os
import re
import shlex

import pytest
import yaml
from conftest import ROOT, output, run_playbook

from ansible_collections.sparkfleet.cluster.plugins.module_utils import tp_padding

GB10_FACTS = {"accelerator": {"kind": "nvidia", "count": 1, "devices": [{"model": "NVIDIA GB10"}]},
              "rdma": {"present": True, "devices": [{"name": "rocep1s0f1", "netdevs": ["enp1s0f1np1"]}]}}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    base = tmp_path_factory.mktemp("gb10")
    extravars = {"render_dir": str(base / "out"), "ansible_connection": "local",
                 "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                 "sparkfleet_api_key": "key-for-rendering-only", "sparkfleet_node": GB10_FACTS,
                 "__vllm_service_fabric_if": "enp1s0f1np1",
                 "__vllm_service_systemd": {"stdout_lines": ["systemd 255 (255.4-1ubuntu8.6)"]},
                 "__vllm_service_model_path": "/var/lib/sparkfleet/hf/hub/models--o--m/snapshots/0123abcd"}
    runner = run_playbook(base / "run", os.path.join(ROOT, "tests/integration/playbooks/render_rank.yml"),
                          inventory=os.path.join(ROOT, "inventory/examples/spark2/hosts.yml"), extravars=extravars)
    assert runner.status == "successful", output(runner)[-4000:]
    assert "key-for-rendering-only" not in output(runner)

    def read(host, name):
        return (base / "out" / host / name).read_text()
    return read


def command_line(launcher):
    """The docker run command of the launcher, as a shell would split it."""
    text = launcher.split("exec docker run", 1)[1].replace("\\\n", " ")
    return shlex.split(text.splitlines()[0])


def test_worker_runs_the_patched_image_headless_against_the_heads_fabric_address(rendered):
    argv = command_line(rendered("spark-b", "vllm-launch"))
    joined = " ".join(argv)
    for flags in ("--gpus all", "--network host", "--ipc host", "--shm-size 32g", "--device /dev/infiniband",
                  "--cap-add IPC_LOCK", "--ulimit memlock=-1", "--env-file /etc/sparkfleet/vllm.env"):
        assert flags in joined, flags
    assert "--privileged" not in argv
    assert argv[argv.index("--entrypoint") + 1] == "vllm"
    serve = argv[argv.index("sparkfleet/vllm:current") + 1:]
    assert serve[:2] == ["serve", "/var/lib/sparkfleet/hf/hub/models--o--m/snapshots/0123abcd"]
    options = " ".join(serve)
    for flags in ("--tensor-parallel-size 2", "--nnodes 2", "--node-rank 1", "--master-addr 192.168.100.10",
                  "--master-port 29521", "--distributed-executor-backend mp", "--headless",
                  "--kv-cache-memory-bytes 9060000000", "--max-model-len 900000", "--served-model-name glm-5.3-flash",
                  "--no-enable-flashinfer-autotune", "--cudagraph-capture-sizes 1 2 4 8 16 32 64",
                  "--kv-cache-dtype sparkfleet_nvfp4"):
        assert flags in options, flags
    spec = serve[serve.index("--speculative-config") + 1]
    assert json.loads(spec) == {"method": "mtp", "num_speculative_tokens": 3}
    assert "--port" not in serve and "--host" not in serve


def test_head_listens_on_its_management_address_and_is_not_headless(rendered):
    serve = command_line(rendered("spark-a", "vllm-launch"))
    options = " ".join(serve)
    assert "--node-rank 0" in options and "--headless" not in serve
    assert "--host 192.168.1.101" in options and "--port 8888" in options
    assert "--shutdown-timeout 300" in options  # a stop drains: no new request, those in flight finish
    assert "--shutdown-timeout" not in command_line(rendered("spark-b", "vllm-launch"))  # the head's engine drains


def test_rank_environment_names_the_fabric_and_keeps_the_key_on_the_head(rendered):
    worker = dict(line.split("=", 1) for line in rendered("spark-b", "vllm.env").splitlines()
                  if line and not line.startswith("#"))
    assert worker["VLLM_HOST_IP"] == "192.168.100.11"
    assert worker["NCCL_SOCKET_IFNAME"] == worker["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"
    # the fabric stage's environment: the RoCE device of the cabled cage and its discovered GID index
    assert worker["NCCL_IB_HCA"] == "rocep1s0f1" and worker["NCCL_IB_GID_INDEX"] == "3"
    assert worker["NCCL_IB_DISABLE"] == "0" and worker["NCCL_NET"] == "IB" and worker["NCCL_NVLS_ENABLE"] == "0"
    nccl = rendered("spark-b", "nccl.env")
    assert all(f"{key}={value}" in nccl.splitlines() for key, value in worker.items() if key.startswith("NCCL_"))
    assert worker["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    # The image the rank runs, by ID: a new image or a rollback rewrites the file and restarts the ranks.
    assert worker["SPARKFLEET_IMAGE_ID"] == "sha256:" + "ab" * 32
    assert worker["HF_HUB_OFFLINE"] == "1"
    assert "VLLM_API_KEY" not in worker
    assert "VLLM_API_KEY=key-for-rendering-only" in rendered("spark-a", "vllm.env")


def test_unit_stops_the_container_gently_and_restarts_a_bounded_number_of_times(rendered):
    unit = rendered("spark-b", "sparkfleet-vllm.service")
    assert "Requires=docker.service" in unit
    # The stop lets the head drain (vLLM's --shutdown-timeout, 300 s) before the 120 s of CUDA teardown.
    assert "ExecStop=/usr/bin/docker stop -t 420 sparkfleet-vllm" in unit
    assert "TimeoutStopSec=430" in unit
    assert "KillMode=mixed" in unit and "KillSignal=SIGTERM" in unit
    # The group's starts are bounded by the supervisor (3); systemd's limit only catches a crashing supervisor.
    assert "StartLimitBurst=5" in unit and "Restart=always" in unit and "RestartPreventExitStatus=75" in unit
    assert "OnFailure=sparkfleet-vllm-gave-up.service" in unit
    assert "RestartMode=direct" in unit  # systemd 255 (DGX OS) would otherwise fire OnFailure at every retry
    assert "User=" not in unit  # docker ranks run the docker client as root
    assert "ExecStart=/usr/bin/python3 /usr/local/libexec/sparkfleet/sparkfleet-group run --config " \
        "/etc/sparkfleet/group.json -- /usr/local/libexec/sparkfleet/vllm-launch" in unit
    group = json.loads(rendered("spark-b", "group.json"))
    # Before every engine start, the group's own restarts included: a leftover container goes, the weights are
    # checked against their verified marker, then the gate.
    assert group["pre"][0] == {"argv": ["/usr/bin/docker", "rm", "-f", "sparkfleet-vllm"], "check": False}
    assert group["pre"][1] == {"argv": ["/usr/local/libexec/sparkfleet/sparkfleet-verify", "weights", "--config",
                                        "/etc/sparkfleet/verify.json"], "check": True}
    gate = group["pre"][2]["argv"]
    assert gate[0].endswith("memory-gate") and group["pre"][2]["check"] is True
    # Weights + runtime + the 9.06e9 pin + the 3 GiB floor of the TP2 profile must be free before a start.
    assert gate[gate.index("--min-available-bytes") + 1] == str(101468602368 + 6442450944 + 9060000000 + 3221225472)
    assert group["rank"] == 1 and group["burst"] == 3 and group["health_url"] == "http://192.168.1.101:8888/health"
    assert [(m["rank"], m["address"]) for m in group["members"]] == [(0, "192.168.100.10"), (1, "192.168.100.11")]


def test_the_head_verifies_each_start_against_the_plan_and_the_workers_do_not(rendered):
    head, worker = (json.loads(rendered(host, "group.json")) for host in ("spark-a", "spark-b"))
    assert head["verify"] == ["/usr/local/libexec/sparkfleet/sparkfleet-verify", "start", "--config",
                              "/etc/sparkfleet/verify.json"]
    assert worker["verify"] is None and head["verify_timeout"] == 600
    assert head["scrub"] == worker["scrub"] == ["/usr/bin/touch", "/var/lib/sparkfleet/verify/scrub-requested"]
    checks = json.loads(rendered("spark-a", "verify.json"))
    with open(os.path.join(ROOT, "profiles/glm-5.3-flash-nvfp4-tp2.yml"), encoding="utf-8") as handle:
        capacity = yaml.safe_load(handle)["capacity"]
    assert checks["expect"] == {"expected_tokens": checks["expect"]["expected_tokens"], "max_model_len": 900000,
                                "min_tokens": capacity["min_pool_tokens"], "tolerance": capacity["tolerance"]}
    assert isinstance(checks["expect"]["expected_tokens"], int) and checks["expect"]["expected_tokens"] > 1_000_000
    identity = checks["known_answer"]["identity"]
    assert identity["revision"] == "0123abcd" * 5 and identity["manifest"] == "f" * 64
    assert identity["image"] == "sha256:" + "ab" * 32 and identity["profile"] == "glm-5.3-flash-nvfp4-tp2"
    assert checks["known_answer"]["logprob_tolerance"] == 0.1 and checks["url"] == "http://192.168.1.101:8888"
    assert checks["weights"]["revision"] == "0123abcd" * 5
    # What differs between the ranks (node rank, headless, the host it listens on) changes no identity.
    assert re.fullmatch(r"[0-9a-f]{40}", identity["args"])
    assert json.loads(rendered("spark-b", "verify.json"))["known_answer"]["identity"] == identity


# --------------------------------------------------------------------------------------------- spark3: TP3, padded

REVISION = "0123abcd" * 5
SPARK3_MARKER = {"revision": REVISION, "manifest_sha256": "e" * 64, "files": []}


@pytest.fixture(scope="module")
def rendered3(tmp_path_factory):
    """The spark3 example (GLM-5.3-Flash NVFP4 at TP3 on a triangle) rendered as the serve stage writes it."""
    import base64

    base = tmp_path_factory.mktemp("gb10-tp3")
    extravars = {"render_dir": str(base / "out"), "ansible_connection": "local", "render_nccl": False,
                 "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                 "sparkfleet_api_key": "key-for-rendering-only", "sparkfleet_node": GB10_FACTS,
                 "__vllm_service_fabric_if": "enp1s0f1np1",
                 "__vllm_service_systemd": {"stdout_lines": ["systemd 255 (255.4-1ubuntu8.6)"]},
                 "__vllm_service_weights_marker": {
                     "content": base64.b64encode(json.dumps(SPARK3_MARKER).encode()).decode()}}
    runner = run_playbook(base / "run", os.path.join(ROOT, "tests/integration/playbooks/render_rank.yml"),
                          inventory=os.path.join(ROOT, "inventory/examples/spark3/hosts.yml"), extravars=extravars)
    assert runner.status == "successful", output(runner)[-4000:]
    assert "key-for-rendering-only" not in output(runner)
    return lambda host, name: (base / "out" / host / name).read_text()


def test_spark3_ranks_load_the_padded_view_with_the_padded_sizes_and_the_loaders_switch(rendered3):
    view = ("/var/lib/sparkfleet/hf/hub/models--local-inference-lab--GLM-5.3-Flash-NVFP4/sparkfleet-padded/"
            f"{REVISION}-tp3")
    for rank, host in enumerate(("spark-a", "spark-b", "spark-c")):
        serve = command_line(rendered3(host, "vllm-launch"))
        serve = serve[serve.index("sparkfleet/vllm:current") + 1:]
        assert serve[:2] == ["serve", view], host
        options = " ".join(serve)
        for flags in ("--tensor-parallel-size 3", "--nnodes 3", f"--node-rank {rank}", "--master-addr 192.168.1.101",
                      "--kv-cache-dtype fp8_e4m3", "--mm-encoder-tp-mode data", "--max-model-len 524288"):
            assert flags in options, (host, flags)
        heads = {"num_attention_heads": 66, "num_key_value_heads": 66, "linear_num_heads": 66,
                 "moe_intermediate_size": 2112}
        assert json.loads(serve[serve.index("--hf-overrides") + 1]) == {**heads, "text_config": heads}
        env = dict(line.split("=", 1) for line in rendered3(host, "vllm.env").splitlines()
                   if line and not line.startswith("#"))
        wanted = {"tp": 3, "widths": [[64, 66], [2048, 2112]], "vocab": True}
        assert json.loads(env["SPARKFLEET_TP_PADDING"]) == wanted
        assert ("--headless" in serve) == (rank > 0)


def test_spark3_padded_view_is_written_once_checked_in_check_mode_kept_and_removed_on_request(tmp_path):
    """The weights stage's module on a hub cache holding a verified GLM-5.3-Flash snapshot (its config.json with the
    model's sizes; the weights themselves are links the view follows, never read)."""
    repo = tmp_path / "hub" / "models--local-inference-lab--GLM-5.3-Flash-NVFP4"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    sizes = {"num_attention_heads": 64, "num_key_value_heads": 64, "linear_num_heads": 64,
             "moe_intermediate_size": 2048}
    config = {"architectures": ["Glm5NextForConditionalGeneration"], **sizes, "vocab_size": 154880,
              "text_config": dict(sizes, hidden_size=6144)}
    (snapshot / "config.json").write_text(json.dumps(config))
    (snapshot / "model-00001-of-00041.safetensors").write_text("weights")
    (repo / ".sparkfleet-verified.json").write_text(json.dumps(SPARK3_MARKER))
    playbook = tmp_path / "view.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Keep the padded view", "hosts": "localhost", "gather_facts": False,
        "vars": {"profile": "{{ lookup('sparkfleet.cluster.model_profile', 'glm-5.3-flash-nvfp4-tp3') }}"},
        "tasks": [{"name": "View", "register": "view", "sparkfleet.cluster.tp_padded_checkpoint": {
            "cache_dir": str(tmp_path / "hub"), "repo_id": "local-inference-lab/GLM-5.3-Flash-NVFP4",
            "tensor_parallel_size": 3, "state": "{{ state }}",
            "padding": "{{ (profile | sparkfleet.cluster.kv_plan(3)).tp_padding if pad | bool else {} }}"}},
            {"name": "Keep what it returned", "check_mode": False, "ansible.builtin.copy": {
                "content": "{{ view | to_json }}", "dest": "{{ result_file }}", "mode": "0600"}}]}]))

    def run(name, pad=True, cmdline="", state="present"):
        result_file = tmp_path / f"{name}.json"
        result = run_playbook(tmp_path / name, str(playbook), cmdline=cmdline,
                              extravars={"pad": pad, "state": state, "result_file": str(result_file)})
        assert result.status == "successful", output(result)[-3000:]
        return json.loads(result_file.read_text())

    checked = run("check", cmdline="--check")
    view = repo / "sparkfleet-padded" / f"{REVISION}-tp3"
    assert checked["changed"] and checked["path"] == str(view) and not view.exists()
    made = run("make")
    assert made["changed"]
    assert made["config"] == {"num_attention_heads": [64, 66], "moe_intermediate_size": [2048, 2112]}
    padded = json.loads((view / "config.json").read_text())
    assert padded["num_attention_heads"] == padded["text_config"]["linear_num_heads"] == 66
    assert padded["moe_intermediate_size"] == 2112 and padded["vocab_size"] == 154880
    assert padded["text_config"]["hidden_size"] == 6144
    assert json.loads((view / "config.json.orig").read_text()) == config
    assert (view / "model-00001-of-00041.safetensors").read_text() == "weights"
    assert os.path.islink(view / "model-00001-of-00041.safetensors")
    assert json.loads((snapshot / "config.json").read_text()) == config  # the verified snapshot is untouched
    assert not run("again")["changed"]
    # What every engine start checks (sparkfleet-verify weights) beside the snapshot's own marker.
    assert tp_padding.view_drift(str(view), str(snapshot), REVISION) == []
    (view / "config.json").write_text("{}")  # drift is reported before a start and put back by the next run
    assert tp_padding.view_drift(str(view), str(snapshot), REVISION) == [
        f"padded view {view}: config.json changed since it was written"]
    assert "made of revision" in tp_padding.view_drift(str(view), str(snapshot), "f" * 40)[0]
    assert run("repair")["changes"] == ["config.json"]
    assert tp_padding.view_drift(str(view), str(snapshot), REVISION) == []
    # A plan that pads nothing needs no view, and keeps the one a rollback may start on; absent removes it.
    unpadded = run("unpadded", pad=False)
    assert not unpadded["changed"] and unpadded["path"] == str(snapshot) and view.is_dir()
    assert run("absent-check", state="absent", cmdline="--check")["changed"] and view.is_dir()
    removed = run("absent", state="absent")
    assert removed["changes"] == [f"{REVISION}-tp3/"] and not (repo / "sparkfleet-padded").exists()
    assert not run("absent-again", state="absent")["changed"]
