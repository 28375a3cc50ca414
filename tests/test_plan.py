"""`batchsim plan` pieces without simulations: SLO parsing, verdicts, the search, Pareto, cost, grid."""

from __future__ import annotations

import io
import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsim.calibrate.hardware import hardware_names
from batchsim.app.config import scenario_from_dict
from batchsim.sim.errors import InputError
from batchsim.app.capacity.planner import PlanSpec
from batchsim.app.capacity.costs import cost_columns, load_prices, parse_prices, price_of
from batchsim.app.capacity.grid import build_configs, parse_knobs, parse_names, parse_tps
from batchsim.app.capacity.search import (FAIL, MIN_REQUESTS, NOT_EVALUABLE, PASS, REFUSED, SLO_METRICS, judge,
                                          parse_slos, search, verdict)
from batchsim.app.capacity.worker import point_key, queue_metrics
from batchsim.reports.capacity import pareto_mask

BASE = {"name": "unit", "model": "llama-3-8b", "hardware": "h100-sxm",
        "policy": {"name": "continuous", "max_num_seqs": 64},
        "workload": {"num_requests": 50, "arrival": {"process": "poisson", "rate": 2.0},
                     "prompt_tokens": {"dist": "fixed", "value": 100},
                     "output_tokens": {"dist": "fixed", "value": 10}}}


def test_parse_slos_names_limits_and_commas():
    assert parse_slos(["p99_ttft_ms=500", "p99_tpot_ms=50, median_queue_ms=20"]) == {
        "p99_ttft_ms": 500.0, "p99_tpot_ms": 50.0, "median_queue_ms": 20.0}
    assert {"p99_itl_ms", "max_itl_ms", "median_e2el_ms", "p99_queue_ms"} <= set(SLO_METRICS)


@pytest.mark.parametrize("items, match", [
    (["p99_latency=5"], "unknown SLO metric 'p99_latency'; valid: mean_ttft_ms"),
    (["p99_ttft_ms"], "expected NAME=LIMIT_MS"),
    (["p99_ttft_ms=0"], "positive"),
    (["p99_ttft_ms=abc"], "not a number"),
    (["p99_ttft_ms=1", "p99_ttft_ms=2"], "given twice"),
    ([], "at least one SLO"),
])
def test_parse_slos_rejects(items, match):
    with pytest.raises(InputError, match=match):
        parse_slos(items)


def test_verdict_fails_rejections_unfinished_and_incomplete_runs_first():
    good = {"all_rejected": 0, "all_unfinished": 0, "measured_requests": 200, "completed": 200, "p99_ttft_ms": 90.0}
    assert verdict(good, {"p99_ttft_ms": 100}) == (True, "")
    assert verdict(good, {"p99_ttft_ms": 80}) == (False, "p99_ttft_ms 90 > 80")
    assert verdict({**good, "all_rejected": 2}, {"p99_ttft_ms": 100}) == (False, "2 requests rejected")
    assert verdict({**good, "all_unfinished": 1}, {}) == (False, "1 requests unfinished at the horizon")
    assert verdict({**good, "completed": 197}, {}) == (False, "only 197 of 200 requests completed")


def test_judge_thin_or_empty_windows_and_null_metrics_are_not_evaluable():
    good = {"all_rejected": 0, "all_unfinished": 0, "measured_requests": 200, "completed": 200, "p99_ttft_ms": 90.0}
    empty = {**good, "measured_requests": 0, "completed": 0, "p99_ttft_ms": None}
    status, why = judge(empty, {"p99_ttft_ms": 100})
    assert status == NOT_EVALUABLE and why.startswith("no request arrived in the measured window")
    assert verdict(empty, {"p99_ttft_ms": 100})[0] is False  # never a pass, though 0.0 ms "met" it before
    status, why = judge({**good, "measured_requests": 99, "completed": 99}, {"p99_ttft_ms": 100})
    assert status == NOT_EVALUABLE and why.startswith("only 99 requests completed in the measured window, fewer than 100")
    assert judge({**good, "measured_requests": 99, "completed": 99}, {"p99_ttft_ms": 100}, min_requests=50) == (PASS, "")
    assert judge({**good, "p99_tpot_ms": None}, {"p99_tpot_ms": 50}) == (
        NOT_EVALUABLE, "p99_tpot_ms is null: no measured request has it")
    assert MIN_REQUESTS == 100


def test_judge_refuses_load_independent_rejections_unless_allowed():
    m = {"num_requests": 300, "all_rejected": 12, "rejected": 12, "all_unfinished": 0, "measured_requests": 300,
         "completed": 288, "p99_ttft_ms": 90.0, "all_rejected_by_reason": {"over max_num_batched_tokens": 12}}
    status, why = judge(m, {"p99_ttft_ms": 100})
    assert status == REFUSED
    assert why == ("rejects 12 of 300 requests at any load (12 over max_num_batched_tokens); raise the limit, "
                   "or plan with --allow-rejections")
    # allowed: the completion rule counts only the requests that were not rejected
    assert judge(m, {"p99_ttft_ms": 100}, allow_rejections=True) == (PASS, "")
    # a full queue is overload: it fails the point whatever --allow-rejections says
    full = {**m, "all_rejected_by_reason": {"queue full": 12}}
    assert judge(full, {"p99_ttft_ms": 100}, allow_rejections=True) == (FAIL, "12 requests rejected (12 queue full)")


def test_search_stops_at_a_point_it_cannot_evaluate():
    # a fixed number of requests: above 10 req/s the warm-up leaves fewer than 100 in the window
    def metrics(rate: float) -> dict:
        done = max(0, int(500 - 40 * rate))
        return {"measured_requests": done, "completed": done, "p99_ttft_ms": 10.0 if done else None}
    out = search(metrics, {"p99_ttft_ms": 100}, 4.0)
    assert out.status == NOT_EVALUABLE and out.capacity == 0.0 and out.metrics is None and out.limit_rate == 16.0
    assert out.limit_reason.startswith("not evaluable at 16 req/s: no request arrived in the measured window")
    assert out.limit_reason.endswith("(every SLO was met at 8 req/s, but the search cannot go past this point)")


def step_metrics(capacity: float):
    """A fake point: latency 10 ms below ``capacity`` req/s, 1000 ms above."""
    return lambda rate: {"p99_ttft_ms": 10.0 if rate <= capacity else 1000.0}


@pytest.mark.parametrize("start", [0.3, 7.0, 40.0, 300.0])
@pytest.mark.parametrize("tol", [0.05, 0.01])
def test_search_brackets_then_bisects_to_the_tolerance(start, tol):
    out = search(step_metrics(12.3), {"p99_ttft_ms": 100}, start, tol)
    assert out.capacity <= 12.3 < out.limit_rate
    assert out.limit_rate - out.capacity <= tol * out.capacity
    assert out.metrics == {"p99_ttft_ms": 10.0} and out.limit_reason == "p99_ttft_ms 1000 > 100"
    assert len(out.trail) == len({r for r, _ in out.trail})  # no rate simulated twice


def test_search_when_nothing_or_everything_passes():
    none = search(lambda r: {"x": 1.0, "p99_ttft_ms": 500.0}, {"p99_ttft_ms": 100}, 8.0, max_halvings=3)
    assert none.capacity == 0.0 and none.metrics is None and none.limit_rate == 1.0
    assert none.limit_reason == "fails even at 1 req/s: p99_ttft_ms 500 > 100"
    assert [r for r, _ in none.trail] == [8.0, 4.0, 2.0, 1.0]
    every = search(lambda r: {"p99_ttft_ms": 1.0}, {"p99_ttft_ms": 100}, 1.0, max_doublings=4)
    assert every.capacity == 16.0 and every.limit_rate is None


def noisy(seed: int):
    """Latency that grows with the rate but is not monotone in it (deterministic in (seed, rate))."""
    def metrics(rate: float) -> dict:
        wobble = (hash((seed, round(rate, 9))) % 1000) / 1000.0
        return {"p99_ttft_ms": 20.0 * rate * (0.6 + 0.8 * wobble)}
    return metrics


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), start=st.floats(0.1, 100.0), a=st.floats(5.0, 2000.0), b=st.floats(5.0, 2000.0),
       tol=st.sampled_from([0.01, 0.05, 0.2]))
def test_capacity_is_monotone_in_the_slo_even_with_noisy_points(seed, start, a, b, tol):
    tight, loose = sorted((a, b))
    f = noisy(seed)
    assert search(f, {"p99_ttft_ms": tight}, start, tol).capacity <= search(f, {"p99_ttft_ms": loose}, start, tol).capacity


def test_pareto_mask_keeps_undominated_and_ties():
    costs = [1.0, 2.0, 3.0, 2.0, 1.0, 4.0]
    lat = [900.0, 500.0, 100.0, 600.0, 900.0, 100.0]
    assert pareto_mask(costs, lat) == [True, True, True, False, True, False]
    assert pareto_mask([], []) == []


def test_cost_columns_exact():
    one = cost_columns(capacity=5.0, tp=2, price=3.0, mean_output_tokens=100.0, target_rate=10.0)
    assert one == {"replicas": 2, "gpus": 4, "usd_per_hour": 12.0,
                   "usd_per_1m_output_tokens": pytest.approx(12.0 / (10 * 100 * 3600) * 1e6)}
    assert cost_columns(5.0, 1, 3.0, 100.0, 10.01)["replicas"] == 3
    solo = cost_columns(4.0, 1, 2.0, 50.0, None)
    assert solo["replicas"] == 1 and solo["usd_per_1m_output_tokens"] == pytest.approx(2.0 / (4 * 50 * 3600) * 1e6)
    assert set(cost_columns(0.0, 1, 2.0, 50.0, 10.0).values()) == {None}


def test_price_table_covers_every_profile_and_overrides(tmp_path):
    table = load_prices()
    assert set(hardware_names()) <= set(table) and all(p > 0 for p in table.values())
    assert parse_prices(["h100-sxm=2.49", "h200=3.5,a100-80gb=1"]) == {"h100-sxm": 2.49, "h200": 3.5, "a100-80gb": 1.0}
    assert price_of("./my-h100.yaml", "h100-sxm", table) == table["h100-sxm"]
    with pytest.raises(InputError, match="no price for hardware 'x'.*--price x=USD_PER_GPU_HOUR"):
        price_of("x", "x", table)
    with pytest.raises(InputError, match="--price"):
        parse_prices(["h100-sxm=-1"])
    bad = tmp_path / "p.yaml"
    bad.write_text("prices: [1, 2]\n")
    with pytest.raises(InputError, match="prices:"):
        load_prices(bad)


def test_parse_lists_and_knobs():
    assert parse_names("a, b,a", "--hardware") == ("a", "b") and parse_names(None, "--x") == ()
    assert parse_tps("1,2, 2") == (1, 2)
    assert parse_knobs(["policy.max_num_batched_tokens=256,512,256", "dtype=bf16,fp8"]) == (
        ("policy.max_num_batched_tokens", (256, 512)), ("dtype", ("bf16", "fp8")))
    for bad, match in ((["x"], "dotted.key"), (["policy.name=a"], "own option"), (["a=1", "a=2"], "twice"),
                       (["a="], "at least one value")):
        with pytest.raises(InputError, match=match):
            parse_knobs(bad)
    with pytest.raises(InputError, match="--tp"):
        parse_tps("0")


def test_grid_applies_policy_knobs_only_where_they_exist():
    sc = scenario_from_dict(BASE)
    knobs = parse_knobs(["policy.max_queue_delay_s=0.01,0.05", "dtype=bf16,fp8"])
    configs = build_configs(sc, ("h100-sxm", "h200"), (1, 2), ("continuous", "dynamic"), knobs)
    # continuous: 2 dtypes; dynamic: 2 delays x 2 dtypes; for 2 hardware x 2 TP
    assert len(configs) == 2 * 2 * (2 + 4)
    labels = [c.label for c in configs]
    assert labels[0] == "h100-sxm tp1 continuous dtype=bf16"
    assert "h200 tp2 dynamic max_queue_delay_s=0.05 dtype=fp8" in labels
    c = configs[-1]
    assert c.scenario["replicas"] == 1 and c.scenario["tensor_parallel_size"] == 2 and c.scenario["dtype"] == "fp8"
    with pytest.raises(InputError, match="none of the policies"):
        build_configs(sc, (), (), ("continuous",), parse_knobs(["policy.max_queue_delay_s=0.1"]))
    with pytest.raises(InputError, match="max_num_seqs"):
        build_configs(sc, (), (), (), parse_knobs(["policy.max_num_seqs=-3"]))


def test_grid_refuses_traces_with_their_own_arrival_times():
    data = {**BASE, "workload": {"trace": {"format": "csv", "path": "t.csv"}}}
    with pytest.raises(InputError, match="supplies its own arrival times"):
        build_configs(scenario_from_dict(data))


def test_spec_check_names_the_bad_option():
    with pytest.raises(InputError, match="--pareto-metric"):
        PlanSpec(slos={"p99_ttft_ms": 1.0}, pareto_metric="p99_latency").check()
    with pytest.raises(InputError, match="--tol"):
        PlanSpec(slos={"p99_ttft_ms": 1.0}, tol=1.5).check()
    with pytest.raises(InputError, match="--target-rate"):
        PlanSpec(slos={"p99_ttft_ms": 1.0}, target_rate=0.0).check()


def test_point_key_is_stable_and_covers_the_point():
    a = {"workload": {"arrival": {"rate": 2.0}}, "horizon_s": 10.0}
    assert point_key(a, None) == point_key({"horizon_s": 10.0, "workload": {"arrival": {"rate": 2.0}}}, "/x")
    assert point_key(a, None) != point_key({**a, "horizon_s": 11.0}, None)
    assert len(point_key(a, None)) == 24


def test_queue_metrics_from_admission_times():
    req = pd.DataFrame({"arrival": [0.0, 1.0, 2.0, 3.0], "admitted": [0.0, 1.5, 2.1, math.nan],
                        "status": ["completed", "completed", "completed", "unfinished"]})
    q = queue_metrics(req)
    assert q["max_queue_ms"] == pytest.approx(500.0) and q["median_queue_ms"] == pytest.approx(100.0)
    assert q["mean_queue_ms"] == pytest.approx(200.0)
    assert queue_metrics(req, warmup_s=0.5)["max_queue_ms"] == pytest.approx(500.0)
    assert queue_metrics(req.iloc[:0])["p99_queue_ms"] is None  # null, not 0: nothing was measured


def test_plan_table_never_breaks_a_number_at_100_columns():
    from rich.console import Console

    from batchsim.reports.capacity import console_table

    def row(config, e2e, status="ok", why="p99_ttft_ms 1754.4 > 1500"):
        hw, tp, policy = config.split()
        return {"config": config, "hardware": hw, "tp": int(tp[2:]), "policy": policy, "knobs": "", "status": status,
                "capacity_rps": 46.38 if status == "ok" else 0.0, "output_tok_s": 12345.6, "p99_ttft_ms": 1391.2,
                "p99_tpot_ms": 47.9, "p99_e2el_ms": e2e, "limit_rps": 48.31, "limit_reason": why, "points": 8,
                "rejected": 0, "usd_per_gpu_hour": 2.95, "target_rps": 40.0, "replicas": 1, "gpus": 2,
                "usd_per_hour": 5.9, "usd_per_1m_output_tokens": 0.132, "pareto": status == "ok"}
    frame = pd.DataFrame([row("h100-sxm tp2 continuous", 19248.3), row("a100-80gb tp1 chunked_prefill", 38603.9),
                          row("h200 tp1 continuous", None, "not evaluable",
                              "not evaluable at 22.08 req/s: no request arrived in the measured window; raise "
                              "workload.num_requests, or lower measure.warmup_s/cooldown_s")])
    for width in (100, 80, 60):
        console = Console(width=width, record=True, file=io.StringIO())
        console.print(console_table(frame, ["p99_ttft_ms", "p99_tpot_ms"], "p99_e2el_ms", 40.0, "plan"))
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= width
        for number in ("38603.9", "19248.3", "1391.2", "46.38"):
            assert number in text, (width, text)
        if width == 100:
            assert "47.9" in text and "0.132" in text and "why it failed" in text
        assert "left out to fit" in text  # what did not fit is named, not cut
    wide = Console(width=240, record=True, file=io.StringIO())
    wide.print(console_table(frame, ["p99_ttft_ms", "p99_tpot_ms"], "p99_e2el_ms", 40.0, "plan"))
    text = wide.export_text()
    assert "left out" not in text and "12346" in text, text
