"""The plugin's entry point loaded by a real vLLM that is not the pinned release (the CPU build, 0.32.0).

vLLM finds the plugin through its own plugin loader and calls register(). 0.32.0 has no KV-cache dtype
registration API, so the plugin must log why and register nothing: vLLM's own config then refuses
--kv-cache-dtype sparkfleet_nvfp4, and stock dtypes keep working unpatched. (A 0.33.0 with a drifted seam is
refused the other way, by a tripwire dtype: tests/image.)
"""

import json
import os
import subprocess

import sourcefile
from conftest import ROOT

PROBE = r"""
import json, logging
logging.basicConfig(level=logging.INFO)
from vllm.plugins import load_general_plugins
load_general_plugins()
import sparkfleet_vllm
from vllm.config import CacheConfig
from vllm.v1.kv_cache_interface import get_kv_quant_mode
problem = sparkfleet_vllm.problem()
out = {"seam": getattr(problem, "seam", None), "problem": str(problem), "stock": get_kv_quant_mode("fp8").name,
       "stock_config": CacheConfig(cache_dtype="fp8").cache_dtype}
try:
    CacheConfig(cache_dtype="sparkfleet_nvfp4")
    out["ours"] = "accepted"
except Exception as exc:
    out["ours"] = f"{type(exc).__name__}: {exc}"
sparkfleet_vllm._registered = False
sparkfleet_vllm.register()
out["again"] = str(sparkfleet_vllm.problem())
print("RESULT " + json.dumps(out))
"""


def test_a_vllm_without_the_dtype_api_gets_nothing_registered_and_runs_stock(cpu_vllm_python, tmp_path):
    install = sourcefile.load("files/image/install.py", "sparkfleet_image_install")
    site = tmp_path / "site"
    site.mkdir()
    install.install_packages(os.path.join(ROOT, "files"), str(site), "test")
    proc = subprocess.run([cpu_vllm_python, "-c", PROBE], capture_output=True, text=True, timeout=300, check=False,
                          env=dict(os.environ, PYTHONPATH=str(site)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["seam"] == "kv_dtype"
    assert result["problem"].startswith("sparkfleet seam 'kv_dtype' (config/cache.py, vLLM 0.32.0): found no "
                                        "register_kv_cache_dtype; expected vLLM's KV-cache dtype registration API")
    assert "--kv-cache-dtype sparkfleet_nvfp4 is not available" in proc.stdout + proc.stderr  # vLLM's logger
    assert result["ours"].startswith("ValidationError") and "sparkfleet_nvfp4" in result["ours"]
    assert result["stock"] == "FP8_PER_TENSOR" and result["stock_config"] == "fp8"
    assert result["again"] == result["problem"]  # a second registration changes nothing
