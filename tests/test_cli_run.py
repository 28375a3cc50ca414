"""`batchsim run` end to end: outputs, determinism, bad input -> exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def batchsim(*args, cwd=None):
    return subprocess.run([sys.executable, "-c", "from batchsim.app.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd or ROOT, timeout=300)


def test_run_writes_records_and_is_byte_identical(tmp_path):
    outs = []
    for i in range(2):
        out = tmp_path / f"o{i}"
        r = batchsim("run", "examples/continuous.yaml", "--set", "workload.num_requests=200",
                     "--out", str(out))
        assert r.returncode == 0, r.stderr
        outs.append(out)
        assert "output throughput" in r.stdout
    for name in ("summary.json", "requests.csv", "steps.csv"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    s = json.loads((outs[0] / "summary.json").read_text())
    assert s["completed"] + s["rejected"] + s["unfinished"] == 200
    for key in ("request_throughput", "output_throughput", "median_ttft_ms", "p99_tpot_ms",
                "mean_itl_ms", "p90_e2el_ms", "mfu", "mbu", "token_efficiency", "peak_kv_usage"):
        assert key in s


@pytest.mark.parametrize("policy", ["static", "dynamic", "continuous", "chunked_prefill"])
def test_run_json_each_policy(policy, tmp_path):
    r = batchsim("run", f"examples/{policy}.yaml", "--set", "workload.num_requests=100", "--json",
                 "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["policy"] == policy and s["completed"] == 100


def test_run_2000_requests_takes_seconds(tmp_path):
    t = time.perf_counter()
    r = batchsim("run", "examples/chunked_prefill.yaml", "--out", str(tmp_path), "--json")
    wall = time.perf_counter() - t
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["completed"] == 2000
    print(f"2000-request chunked_prefill run: {wall:.1f} s")


@pytest.mark.parametrize("args, needle", [
    (["run", "nope.yaml"], "no such scenario file: nope.yaml"),
    (["run", "examples/continuous.yaml", "--set", "policy.max_num_seqs=0"], "policy.max_num_seqs"),
    (["run", "examples/continuous.yaml", "--set", "replicas=-1"], "replicas"),
    (["run", "examples/continuous.yaml", "--set", "model=gpt-17"], "gpt-17"),
    (["run", "examples/continuous.yaml", "--set", "router=random"], "unknown router 'random'"),
    (["run", "examples/continuous.yaml", "--policy", "fifo"], "fifo"),
    (["run", "examples/continuous.yaml", "--set", "bogus=1"], "bogus"),
])
def test_bad_input_exits_2_without_traceback(args, needle):
    r = batchsim(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert needle in r.stderr, r.stderr


def test_bad_yaml_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model: llama-3-8b\npolicy: [unclosed\n")
    r = batchsim("run", str(p))
    assert r.returncode == 2 and "bad.yaml:" in r.stderr and "Traceback" not in r.stderr
