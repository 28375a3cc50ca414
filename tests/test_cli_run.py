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


def test_summary_says_what_produced_it_and_run_policy_applies_policy_knobs(tmp_path):
    """summary.json's provenance: resolved model, hardware, knobs, KV capacity, seed, version, engine, a
    scenario hash and the command; `run --policy X` uses the scenario's policy_knobs for X (as plan does)."""
    import json

    from typer.testing import CliRunner

    from batchsim.app.cli import app

    sc = tmp_path / "pk.yaml"
    sc.write_text("name: pk\nmodel: llama-3-8b\nhardware: h100-sxm\npolicy: {name: continuous, block_size: 32}\n"
                  "policy_knobs:\n  chunked_prefill: {max_num_batched_tokens: 2048}\n"
                  "workload: {num_requests: 30, arrival: {process: poisson, rate: 5},\n"
                  "  prompt_tokens: {dist: fixed, value: 100}, output_tokens: {dist: fixed, value: 10}}\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["run", str(sc), "--policy", "chunked_prefill", "--set", "seed=3",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    prov = json.loads((out / "summary.json").read_text())["provenance"]
    assert prov["policy"]["name"] == "chunked_prefill"
    assert prov["policy"]["max_num_batched_tokens"] == 2048 and prov["policy"]["block_size"] == 32
    assert prov["model"] == "llama-3-8b" and prov["hardware"] == "h100-sxm" and prov["seed"] == 3
    assert prov["kv_capacity_tokens_per_replica"] == prov["kv_blocks_per_replica"] * 32
    assert prov["engine"] in ("core", "python") and len(prov["scenario_hash"]) == 16
    assert prov["command"] == f"batchsim run {sc} --policy chunked_prefill --set seed=3"
    # the command reproduces the summary
    again = tmp_path / "again"
    args = prov["command"].split()[1:] + ["--out", str(again)]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert (again / "summary.json").read_text() == (out / "summary.json").read_text()
