"""`batchsim plan` end to end on tiny scenarios: monotone in the SLO, chunked prefill under a
tight TBT SLO, "does not fit", the report, kill-and-resume, and Ray giving the process pool's plan."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchsim.app.cli import app
from batchsim.app.config import load_scenario
from batchsim.app.capacity.planner import PlanSpec, plan, write_plan
from tests.test_report_html import check_html

ROOT = Path(__file__).resolve().parent.parent

TINY = """\
name: "plan-tiny <b>"
model: llama-3-8b
hardware: h100-sxm
policy: {name: continuous, max_num_seqs: 64}
policy_knobs:
  chunked_prefill: {max_num_seqs: 64, max_num_batched_tokens: 512}
workload:
  num_requests: 100
  arrival: {process: poisson, rate: 5.0}
  prompt_tokens: {dist: lognormal, median: 300, p90: 1200, max: 3000}
  output_tokens: {dist: lognormal, median: 24, p90: 80, max: 160}
seed: 3
"""

# Long prompts, short answers: a whole-prompt prefill (continuous, separate mode) stalls every
# running decode for tens of ms; a 256-token chunk budget keeps each gap short.
TBT = """\
name: plan-tbt
model: llama-3-8b
hardware: h100-sxm
policy: {name: continuous, max_num_seqs: 64, prefill_mode: separate}
policy_knobs:
  chunked_prefill: {max_num_seqs: 64, max_num_batched_tokens: 256}
workload:
  num_requests: 80
  arrival: {process: poisson, rate: 5.0}
  prompt_tokens: {dist: lognormal, median: 1000, p90: 3000, max: 4000}
  output_tokens: {dist: lognormal, median: 32, p90: 100, max: 200}
seed: 5
"""

POOL_ARGS = ["--slo", "p99_ttft_ms=500", "--slo", "p99_tpot_ms=40", "--policies", "continuous,chunked_prefill",
             "--hardware", "h100-sxm,h200", "--target-rate", "50"]
POOL_SPEC = PlanSpec(slos={"p99_ttft_ms": 500.0, "p99_tpot_ms": 40.0}, hardware=("h100-sxm", "h200"),
                     policies=("continuous", "chunked_prefill"), target_rate=50.0)


def scenario_file(tmp: Path, text: str, name: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pool_plan(tmp_path_factory):
    """The 4-configuration plan on the local process pool: the reference for resume and Ray."""
    tmp = tmp_path_factory.mktemp("plan")
    path = scenario_file(tmp, TINY, "tiny")
    out = tmp / "pool"
    res = plan(load_scenario(path), POOL_SPEC, out, base_dir=path.parent, executor="local", workers=2,
               show_progress=False, source=(str(path), ()))
    return path, res, write_plan(res, out)


def test_pool_plan_rows_costs_and_files(pool_plan):
    _, res, files = pool_plan
    f = res.frame
    assert len(f) == 4 and set(f["status"]) == {"ok"} and res.reused == 0
    assert res.simulated == int(f["points"].sum())
    assert list(f["usd_per_1m_output_tokens"]) == sorted(f["usd_per_1m_output_tokens"])
    for _, r in f.iterrows():
        assert r["p99_ttft_ms"] <= 500 and r["p99_tpot_ms"] <= 40 and r["capacity_rps"] > 0
        assert r["replicas"] * r["capacity_rps"] >= 50 > (r["replicas"] - 1) * r["capacity_rps"]
        assert r["gpus"] == r["replicas"] and r["usd_per_hour"] == pytest.approx(r["gpus"] * r["usd_per_gpu_hour"])
        assert r["limit_rps"] - r["capacity_rps"] <= 0.05 * r["capacity_rps"] + 1e-12
    assert f["pareto"].any()
    header = files["plan.csv"].read_text().splitlines()[0]
    assert header.startswith("config,hardware,tp,policy,knobs,status,capacity_rps,capacity_estimate_rps,"
                             "capacity_high_rps,output_tok_s,p99_ttft_ms,p99_ttft_ms_ci95,p99_tpot_ms,")


def test_plan_report_is_self_contained_and_escaped(pool_plan):
    _, _, files = pool_plan
    text = files["plan.html"].read_text(encoding="utf-8")
    c = check_html(text)
    assert len(c.images) == 1 and "plan-tiny &lt;b&gt;" in text and "plan-tiny <b>" not in text
    assert text.count("<tr>") == 5 and "Pareto front" in text


def test_capacity_is_monotone_in_the_slo(tmp_path):
    path = scenario_file(tmp_path, TINY, "tiny")
    sc, caps = load_scenario(path), []
    for tpot in (20.0, 30.0, 45.0, 80.0):  # one points folder: looser SLOs revisit stored points
        spec = PlanSpec(slos={"p99_ttft_ms": 1000.0, "p99_tpot_ms": tpot})
        caps.append(plan(sc, spec, tmp_path / "out", executor="serial", show_progress=False).frame["capacity_rps"][0])
    assert caps == sorted(caps) and caps[-1] > caps[0] > 0


def test_chunked_prefill_beats_continuous_under_a_tight_tbt_slo(tmp_path):
    path = scenario_file(tmp_path, TBT, "tbt")
    # 80 requests a point: judge them all (the default asks for 100 completed in the measured window)
    spec = PlanSpec(slos={"p99_itl_ms": 25.0, "p99_ttft_ms": 3000.0}, policies=("continuous", "chunked_prefill"),
                    min_requests=50)
    f = plan(load_scenario(path), spec, tmp_path / "out", executor="local", workers=2, show_progress=False).frame
    cap = dict(zip(f["policy"], f["capacity_rps"]))
    assert cap["chunked_prefill"] > 3 * cap["continuous"]
    assert f.set_index("policy").loc["chunked_prefill", "p99_itl_ms"] <= 25.0


def test_a_config_that_does_not_fit_is_a_row_not_a_crash(tmp_path):
    path = scenario_file(tmp_path, TINY, "tiny")
    sc = load_scenario(path, ["model=llama-3-70b"])
    res = plan(sc, PlanSpec(slos={"p99_ttft_ms": 500.0}, hardware=("a100-80gb",)), tmp_path / "o",
               executor="serial", show_progress=False)
    row = res.frame.iloc[0]
    assert row["status"] == "does not fit" and "does not fit on a100-80gb at tp=1" in row["limit_reason"]
    assert row["usd_per_hour"] is None and res.simulated == 0
    check_html(write_plan(res, tmp_path / "o")["plan.html"].read_text(encoding="utf-8"))


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from batchsim.app.cli import main; main()", *args]


def test_killed_plan_resumes_without_redoing_points(pool_plan, tmp_path):
    path, ref, ref_files = pool_plan
    out = tmp_path / "killed"
    args = ["plan", str(path), *POOL_ARGS, "--executor", "local", "--workers", "2", "--out", str(out)]
    proc = subprocess.Popen(_cli(*args), cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    points, deadline = out / "points", time.monotonic() + 120
    while len(list(points.glob("*.json"))) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the plan finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its pool workers, mid-search
    proc.wait()
    before = {p.name: p.stat().st_mtime_ns for p in points.glob("*.json")}
    total = int(ref.frame["points"].sum())
    assert 3 <= len(before) < total and not (out / "plan.csv").exists()

    rerun = CliRunner().invoke(app, [*args])
    assert rerun.exit_code == 0, rerun.output
    done = re.search(r"points: (\d+) simulated, (\d+) reused", rerun.output)
    assert done and (int(done[1]), int(done[2])) == (total - len(before), len(before))
    assert {p.name: p.stat().st_mtime_ns for p in points.glob("*.json") if p.name in before} == before
    assert len(list(points.glob("*.json"))) == total
    assert (out / "plan.csv").read_bytes() == ref_files["plan.csv"].read_bytes()


def test_ray_gives_the_process_pool_plan(pool_plan, tmp_path):
    ray = pytest.importorskip("ray")
    path, _, ref_files = pool_plan
    try:
        res = plan(load_scenario(path), POOL_SPEC, tmp_path / "ray", base_dir=path.parent, executor="ray",
                   show_progress=False, source=(str(path), ()))
    finally:
        ray.shutdown()
    files = write_plan(res, tmp_path / "ray")
    assert files["plan.csv"].read_bytes() == ref_files["plan.csv"].read_bytes()


def test_cli_unknown_slo_exits_2_listing_the_valid_ones(tmp_path, monkeypatch, capsys):
    from batchsim.app.cli import main

    path = scenario_file(tmp_path, TINY, "tiny")
    monkeypatch.setattr(sys, "argv", ["batchsim", "plan", str(path), "--slo", "p99_latency_ms=5",
                                      "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unknown SLO metric 'p99_latency_ms'" in err and "p99_tpot_ms" in err
    assert "Traceback" not in err


def test_cli_missing_price_fails_before_any_run(tmp_path, monkeypatch, capsys):
    from batchsim.app.cli import main

    path = scenario_file(tmp_path, TINY, "tiny")
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices: {h100-sxm: 2.0}\n")
    monkeypatch.setattr(sys, "argv", ["batchsim", "plan", str(path), "--slo", "p99_ttft_ms=500", "--hardware",
                                      "h100-sxm,h200", "--prices", str(prices), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and "no price for hardware 'h200'" in capsys.readouterr().err
    assert not (tmp_path / "o" / "points").exists()


def test_a_warmup_longer_than_every_run_reports_no_capacity(tmp_path):
    """0 measured requests used to give 0.0 ms latencies that passed every SLO (capacity 361,758 req/s)."""
    path = scenario_file(tmp_path, TINY, "tiny")
    sc = load_scenario(path, ["measure.warmup_s=100000"])
    res = plan(sc, PlanSpec(slos={"p99_ttft_ms": 500.0}), tmp_path / "o", executor="serial", show_progress=False)
    row = res.frame.iloc[0]
    # (an empty window doubles the run until it measures, here to the cap of 10 x its requests: 5 runs)
    assert row["status"] == "not evaluable" and row["capacity_rps"] == 0.0 and res.simulated == 5
    assert row["usd_per_hour"] is None and row["p99_ttft_ms"] is None
    assert "no request arrived in the measured window" in row["limit_reason"]
    html = write_plan(res, tmp_path / "o")["plan.html"].read_text(encoding="utf-8")
    check_html(html)
    assert "Configurations without a capacity" in html and "NOT EVALUABLE" in html


def test_cli_plan_with_a_warmup_past_the_fast_points_lengthens_them_until_they_measure(tmp_path):
    """The command from the issue: 500 requests a point, warm-up 30 s; fast points had an empty window,
    which made the configuration not evaluable. They now run longer until the window measures."""
    out = tmp_path / "plan"
    res = CliRunner().invoke(app, ["plan", str(ROOT / "examples" / "plan-chat.yaml"), "--slo", "p99_ttft_ms=1500",
                                   "--slo", "p99_tpot_ms=60", "--hardware", "h100-sxm", "--tp", "1",
                                   "--set", "measure.warmup_s=30", "--target-rate", "40", "--executor", "serial",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "NOT EVALUABLE" not in res.output and "longer points: " in res.output
    import pandas as pd
    row = pd.read_csv(out / "plan.csv").iloc[0]
    assert row["status"] == "ok" and 14 < row["capacity_rps"] < 18 and row["point_requests"] > 500


REJECTING = TINY.replace("policy: {name: continuous, max_num_seqs: 64}",
                         "policy: {name: continuous, max_num_seqs: 64, max_num_batched_tokens: 1024}")


def test_a_config_that_rejects_requests_is_refused_unless_allowed(tmp_path):
    path = scenario_file(tmp_path, REJECTING, "rej")
    sc = load_scenario(path)
    refused = plan(sc, PlanSpec(slos={"p99_ttft_ms": 2000.0}), tmp_path / "o", executor="serial",
                   show_progress=False).frame.iloc[0]
    assert refused["status"] == "rejects requests" and refused["capacity_rps"] == 0.0 and refused["points"] == 1
    assert re.search(r"rejects \d+ of 100 requests at any load \(\d+ over max_num_batched_tokens\); raise the "
                     r"limit, or plan with --allow-rejections", refused["limit_reason"]), refused["limit_reason"]
    # allowed: 80 of the 100 requests are served, so ask for 50 completed in the window
    allowed = plan(sc, PlanSpec(slos={"p99_tpot_ms": 40.0}, allow_rejections=True, min_requests=50),
                   tmp_path / "o", executor="serial", show_progress=False)
    row = allowed.frame.iloc[0]
    # (the row's count is the mean over its seeds; the refusal names the first seed's)
    assert row["status"] == "ok" and row["capacity_rps"] > 0 and row["rejected"] > 0
    # output tok/s and $/1M price the served requests' tokens only (rejected ones are long prompts
    # here, whose outputs are as long as any: a share of the workload's mean output per request)
    from batchsim.app.runner import build_parts

    mean_all = float(build_parts(sc, path.parent).workload.output_tokens.mean())
    per_request = row["output_tok_s"] / row["capacity_rps"]
    assert 0.5 * mean_all < per_request < 0.999 * mean_all
    assert row["usd_per_1m_output_tokens"] == pytest.approx(row["usd_per_hour"] / (row["output_tok_s"] * 3600) * 1e6)
    cli = CliRunner().invoke(app, ["plan", str(path), "--slo", "p99_ttft_ms=2000", "--executor", "serial",
                                   "--out", str(tmp_path / "o")])
    assert cli.exit_code == 0, cli.output
    assert "REJECTS h100-sxm tp1 continuous: rejects" in cli.output
    cli = CliRunner().invoke(app, ["plan", str(path), "--slo", "p99_tpot_ms=40", "--executor", "serial",
                                   "--allow-rejections", "--min-requests", "50", "--out", str(tmp_path / "o")])
    assert cli.exit_code == 0 and "allowed by --allow-rejections" in cli.output, cli.output
