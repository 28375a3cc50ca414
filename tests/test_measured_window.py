"""Answers users can act on: empty or thin measured windows give null latencies and warnings
(never 0.0 ms), rejections are counted by kind and flagged by `run`, `compare` and `sweep`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from batchsim.app.cli import app
from batchsim.app.compare import compare, write_comparison
from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import run_scenario
from batchsim.app.summary_table import summary_table
from batchsim.reports.stats import aggregate
from batchsim.sim.measure import MIN_REQUESTS
from batchsim.sim.metrics import latency_keys, rejection_kind, rejections_by_kind
from tests.test_report_html import check_html

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
MOONCAKE = TRACES / "mooncake_fast25_synthetic_trace.jsonl"

SMALL = {"name": "window", "model": "llama-3-8b", "hardware": "h100-sxm",
         "policy": {"name": "continuous", "max_num_seqs": 64},
         "workload": {"num_requests": 150, "arrival": {"process": "poisson", "rate": 10.0},
                      "prompt_tokens": {"dist": "lognormal", "median": 300, "p90": 1200, "max": 3000},
                      "output_tokens": {"dist": "lognormal", "median": 40, "p90": 120, "max": 300}},
         "seed": 2}


def render(table, width: int = 140) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return " ".join(console.export_text().split())  # wrapping aside


def test_rejection_reasons_are_grouped_by_kind_without_numbers():
    from batchsim.policies.step import over_budget
    from batchsim.sim.engine import over_kv, queue_full, too_long

    assert rejection_kind(too_long(9000, 8192)) == "over max_model_len"
    assert rejection_kind(over_kv(9000, 4096)) == "over KV capacity"
    assert rejection_kind(queue_full(10)) == "queue full"
    assert rejection_kind(over_budget(9000, 8192)) == "over max_num_batched_tokens"
    assert rejection_kind("plugin said no to 12 tokens (limit 3.5)") == "plugin said no to N tokens (limit N)"
    assert rejections_by_kind([over_budget(1, 2), too_long(3, 4), over_budget(5, 6)]) == {
        "over max_num_batched_tokens": 2, "over max_model_len": 1}


def test_empty_window_gives_null_latencies_and_a_warning():
    sc = scenario_from_dict({**SMALL, "measure": {"warmup_s": 100000}})
    s = run_scenario(sc).summary
    assert s["measured_requests"] == 0 and s["completed"] == 0
    assert all(s[k] is None for k in latency_keys()), {k: s[k] for k in latency_keys()}
    assert s["rejected_by_reason"] == {}
    (warning,) = s["warnings"]
    assert warning.startswith("no requests in the measured window (measure.warmup_s 100000 s >= the last arrival at")
    json.dumps(s, allow_nan=False)  # null, not NaN
    text = render(summary_table([s]))
    assert "— / —" in text and "0.0 / 0.0" not in text
    assert text.count("no requests in the measured window") == 1


def test_thin_window_warns_and_a_full_one_does_not():
    few = run_scenario(scenario_from_dict({**SMALL, "measure": {"warmup_s": 10}})).summary
    assert 0 < few["completed"] < MIN_REQUESTS and few["p99_ttft_ms"] is not None
    assert few["warnings"][0] == (f"only {few['completed']} requests completed in the measured window, fewer than "
                                  f"{MIN_REQUESTS}: a p99 over so few is about the maximum, not a percentile")
    # (150 requests at 10 req/s span 15 s: short of a steady state too, which the next warning says)
    assert len(few["warnings"]) == 2 and "of the span a steady state needs" in few["warnings"][1]
    full = run_scenario(scenario_from_dict(SMALL)).summary
    assert full["completed"] >= MIN_REQUESTS and not any("completed" in w for w in full["warnings"])
    steady = run_scenario(scenario_from_dict({**SMALL, "workload": {**SMALL["workload"], "num_requests": 1500}})).summary
    assert steady["warnings"] == []


def test_cli_run_with_a_warmup_past_the_run_shows_dashes_and_warns_once(tmp_path):
    """The command from the issue, smaller: it printed 0.0 ms latencies with no warning."""
    res = CliRunner().invoke(app, ["run", str(ROOT / "examples" / "continuous.yaml"), "--set",
                                   "workload.num_requests=200", "--set", "measure.warmup_s=100000",
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "— / —" in flat and "0.0 / 0.0" not in flat
    assert flat.count("no requests in the measured window") == 1
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["p99_ttft_ms"] is None and s["warnings"]


def test_seeds_keep_nulls_null_and_union_warnings():
    a = {"policy": "p", "completed": 0, "p99_ttft_ms": None, "warnings": ["warn a"], "rejected_by_reason": {}}
    b = {"policy": "p", "completed": 10, "p99_ttft_ms": 5.0, "warnings": ["warn a", "warn b"],
         "rejected_by_reason": {"queue full": 4}}
    out = aggregate([a, b])
    assert out["p99_ttft_ms"] is None and out["p99_ttft_ms_ci95"] is None and out["completed"] == 5.0
    assert out["warnings"] == ["warn a (2 of 2 seeds)", "warn b (1 of 2 seeds)"]
    assert out["rejected_by_reason"] == {"queue full": 2.0}
    # the same warning with other numbers is one kind: said once, with the first seed's numbers
    assert aggregate([{"warnings": ["only 40 completed"]}, {"warnings": ["only 38 completed"]}])["warnings"] == [
        "only 40 completed (2 of 2 seeds)"]
    both = aggregate([a, dict(a)])
    assert both["p99_ttft_ms"] is None and "p99_ttft_ms_ci95" in both


def test_compare_with_an_empty_window_writes_empty_csv_cells_and_a_report(tmp_path):
    sc = scenario_from_dict({**SMALL, "measure": {"warmup_s": 100000}})
    comp = compare(sc, ["continuous", "chunked_prefill"], seeds=2, executor="serial", show_progress=False)
    files = write_comparison(comp, tmp_path)
    df = pd.read_csv(files["summary.csv"])
    assert df["p99_ttft_ms"].isna().all() and df["p99_ttft_ms_ci95"].isna().all()
    assert json.loads(df["warnings"][0])[0].startswith("no requests in the measured window")
    html = files["report.html"].read_text(encoding="utf-8")
    check_html(html)
    assert "<h2>Warnings</h2>" in html and "no requests in the measured window" in html
    text = render(summary_table(comp.summaries))
    assert text.count("warning: continuous: no requests in the measured window") == 1


def test_sweep_prints_each_points_warnings(tmp_path):
    out = tmp_path / "sw"
    res = CliRunner().invoke(app, ["sweep", str(ROOT / "examples" / "continuous.yaml"), "--rates", "4,8",
                                   "--policies", "continuous", "--set", "workload.num_requests=60",
                                   "--executor", "serial", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "warning: continuous @ 4 req/s: only 60 requests completed" in res.output
    assert "warning: continuous @ 8 req/s: only 60 requests completed" in res.output
    assert "only 60 requests completed" in (out / "report.html").read_text(encoding="utf-8")
    assert json.loads(pd.read_csv(out / "sweep.csv")["warnings"][0])


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"{MOONCAKE} not present")
def test_compare_on_a_trace_flags_the_policy_that_rejects(tmp_path):
    """On Mooncake, continuous batching rejects every prompt over its 8192-token step budget
    (about half of them) and still shows a goodput; it must say so."""
    path = tmp_path / "mooncake.yaml"
    path.write_text(f"""\
name: mooncake-rejects
model: llama-3.1-8b
hardware: h100-sxm
policy: {{name: continuous}}
workload:
  trace: {{format: mooncake, path: {MOONCAKE}, end_s: 60}}
seed: 0
""")
    out = tmp_path / "cmp"
    res = CliRunner().invoke(app, ["compare", str(path), "--policies", "continuous,chunked_prefill",
                                   "--executor", "serial", "--out", str(out)])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "summary.csv").set_index("policy")
    kinds = json.loads(df.loc["continuous", "rejected_by_reason"])
    assert kinds["over max_num_batched_tokens"] == df.loc["continuous", "rejected"] > 50
    assert json.loads(df.loc["chunked_prefill", "rejected_by_reason"]) == {}
    n, m = int(df.loc["continuous", "rejected"]), int(df.loc["continuous", "measured_requests"])
    flat = " ".join(res.output.split())
    assert (f"warning: continuous: {n} of {m} measured requests rejected ({n} over max_num_batched_tokens): "
            "they never ran, so goodput counts them as failing") in flat
    assert "warning: chunked_prefill" not in flat.replace("warning: chunked_prefill: the measured requests arrive "
                                                          "within", "")  # (a 60 s window: short of a steady state)
    html = (out / "report.html").read_text(encoding="utf-8")
    check_html(html)
    assert "<h2>Rejected requests</h2>" in html and f"{n} over max_num_batched_tokens" in html
    # goodput: only completed requests that met every SLO count (rejected ones never do)
    assert df.loc["continuous", "request_goodput"] <= df.loc["continuous", "request_throughput"]
    assert np.isclose(df.loc["continuous", "request_throughput"] * df.loc["continuous", "duration_s"],
                      df.loc["continuous", "completed"])
