"""make tp3: TP3 for real, on three lab nodes, with a model whose dimensions do not divide by 3.

The lab (3 nodes on a switch, its own subnets) serves profiles/tiny-cpu-padded.yml through site.yml, the same path
as real Sparks:
- preflight plans the padding;
- the weights stage keeps the padded view;
- the native venv gets the loader seams;
- every rank starts with the group's padding switch;
- the head verifies the pool the planner expects with the padded heads.

A check run on the fresh nodes comes first, and a second converge changes nothing. The group's greedy tokens and
logprobs are then compared with those of the unpadded model at TP1, served on the head node from the verified
snapshot by the same vLLM. Not part of `make test`, whose 40 minutes it does not fit (a 3-node converge with
three vLLM installs); `make tp3` runs it after test_tp_padding.
"""

import inspect
import json
import os

import pytest
import tp_proof
from conftest import NOTES, ROOT, api_key, lab_hosts, on_node, output, run_playbook

PROFILE = "tiny-cpu-padded"
VIEW_ROOT = f"/var/lib/sparkfleet/hf/hub/models--sparkfleet--{PROFILE}"
REFERENCE_PORT = 18431


def site(lab, where, cmdline=""):
    return run_playbook(where, os.path.join(ROOT, "site.yml"), inventory=lab["inventory"], cmdline=cmdline)


@pytest.fixture(scope="module")
def converged(tp3_lab, tmp_path_factory):
    base = tmp_path_factory.mktemp("tp3")
    checked = site(tp3_lab, base / "check", "--check")
    assert checked.status == "successful", output(checked)[-5000:]
    first = site(tp3_lab, base / "converge")
    assert first.status == "successful", output(first)[-6000:]
    second = site(tp3_lab, base / "again")
    assert second.status == "successful", output(second)[-4000:]
    return {"check": checked, "converge": first, "again": second}


def test_the_plan_pads_and_a_second_converge_changes_nothing(converged, tp3_lab):
    text = output(converged["converge"])
    assert "verified: tiny-cpu-padded" in text, text[-3000:]
    assert sum(converged["again"].stats.get("changed", {}).values()) == 0, converged["again"].stats
    for node in ("node0", "node1", "node2"):
        launcher = on_node(tp3_lab, node, "cat", "/usr/local/libexec/sparkfleet/vllm-launch").stdout
        assert f"{VIEW_ROOT}/sparkfleet-padded/" in launcher and "-tp3 " in launcher, launcher
        assert '"intermediate_size":1008' in launcher and '"num_attention_heads":12' in launcher
        env = on_node(tp3_lab, node, "cat", "/etc/sparkfleet/vllm.env").stdout
        assert 'SPARKFLEET_TP_PADDING={"tp":3,"vocab":true,"widths":[[10,12],[1000,1008]]}' in env
        seams = on_node(tp3_lab, node, "/opt/sparkfleet/vllm/bin/python", "-m", "sparkfleet_vllm", "check",
                        "--padding").stdout
        assert "every seam in place (tp_pad_linear, tp_pad_moe, tp_pad_vocab)" in seams


def reference_on_head(lab):
    """The unpadded model at TP1 on the head node, from the verified snapshot, with the same vLLM (the group's
    ranks keep serving beside it); its completions, asked on the node itself."""
    snapshot = on_node(lab, "node0", "sh", "-c", f"ls -d {VIEW_ROOT}/snapshots/*").stdout.strip()
    script = "\n".join([
        "import json, os, signal, subprocess, sys, tempfile, time, urllib.request",
        inspect.getsource(tp_proof).split("\ndef differences", 1)[0],
        f"work = tempfile.mkdtemp(prefix='sf-ref-'); snapshot = {snapshot!r}; port = {REFERENCE_PORT}",
        "env = dict(os.environ, HF_HUB_OFFLINE='1', VLLM_HOST_IP='127.0.0.1', GLOO_SOCKET_IFNAME='lo',",
        "           TORCHDYNAMO_DISABLE='1', TMPDIR=work, HOME=work, VLLM_CACHE_ROOT=work)",
        "env.pop('SPARKFLEET_TP_PADDING', None)",
        "argv = ['/opt/sparkfleet/vllm/bin/python', '-m', 'vllm.entrypoints.openai.api_server', '--model', snapshot,",
        "        '--host', '127.0.0.1', '--port', str(port), '--served-model-name', 'reference', '--dtype',",
        "        'float32', '--max-model-len', '512', '--block-size', '128', '--kv-cache-memory-bytes', '67108864',",
        "        '--enforce-eager']",
        "log = open(os.path.join(work, 'vllm.log'), 'wb')",
        "proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)",
        "try:",
        "    for _ in range(600):",
        "        if proc.poll() is not None:",
        "            sys.exit('reference exited %s: %s' % (proc.returncode, open(log.name).read()[-3000:]))",
        "        try:",
        "            urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=3); break",
        "        except OSError:",
        "            time.sleep(1)",
        "    print('RESULT ' + json.dumps(greedy(f'http://127.0.0.1:{port}', 'reference')))",
        "finally:",
        "    os.killpg(proc.pid, signal.SIGTERM)",  # the session this script started, led by that PID
        "    proc.wait(60)",
    ])
    ran = on_node(lab, "node0", "python3", "-c", script, timeout=900)
    return json.loads(ran.stdout.split("RESULT ", 1)[1])


def test_the_padded_tp3_group_gives_the_tokens_and_logprobs_of_unpadded_tp1(converged, tp3_lab):
    url = f"http://{lab_hosts(tp3_lab)['node0']['ansible_host']}:8888"
    group = tp_proof.greedy(url, PROFILE, api_key(tp3_lab))
    reference = reference_on_head(tp3_lab)
    problems, largest = tp_proof.differences(reference, group)
    NOTES.append(f"tp3 lab: padded TP3 over three nodes vs TP1: {sum(len(a['tokens']) for a in group)} tokens "
                 f"compared, largest logprob difference {largest:.2e}")
    assert not problems, "\n".join(problems)


def test_a_changed_padded_config_is_refused_before_any_engine_start(converged, tp3_lab):
    """The check every rank runs before its engine starts covers the padded view as well as the snapshot."""
    check = ["/usr/local/libexec/sparkfleet/sparkfleet-verify", "weights", "--config", "/etc/sparkfleet/verify.json"]
    assert on_node(tp3_lab, "node1", *check, check=False).returncode == 0
    config = on_node(tp3_lab, "node1", "sh", "-c", f"ls -d {VIEW_ROOT}/sparkfleet-padded/*-tp3").stdout.strip()
    config += "/config.json"
    kept = on_node(tp3_lab, "node1", "cat", config).stdout
    on_node(tp3_lab, "node1", "sh", "-c", f"printf '{{}}' > {config}")
    refused = on_node(tp3_lab, "node1", *check, check=False)
    assert refused.returncode != 0
    assert "config.json changed since it was written" in refused.stdout + refused.stderr
    on_node(tp3_lab, "node1", "python3", "-c", f"open({config!r}, 'w').write({kept!r})")
    assert on_node(tp3_lab, "node1", *check, check=False).returncode == 0
