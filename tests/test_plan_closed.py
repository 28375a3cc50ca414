"""`batchsim plan` over a closed loop's clients (issue #22: plans over concurrency as well as rate)."""

from __future__ import annotations

import pytest

from batchsim.app.capacity.planner import PlanSpec, plan
from batchsim.app.capacity.search import FAIL, PASS, search
from batchsim.app.config import scenario_from_dict


def step(capacity: int):
    return lambda n: {"p99_ttft_ms": 10.0 if n <= capacity else 1000.0}


@pytest.mark.parametrize("start", [1, 3, 16, 200])
@pytest.mark.parametrize("capacity", [1, 7, 38, 100])
def test_an_integer_search_brackets_whole_client_counts(start, capacity):
    out = search(step(capacity), {"p99_ttft_ms": 100}, start, 0.05, integer=True, unit="clients", max_doublings=16)
    assert out.status == PASS and out.capacity <= capacity < out.limit_rate
    assert out.limit_rate - out.capacity <= max(1, 0.05 * out.capacity)
    exact = search(step(capacity), {"p99_ttft_ms": 100}, start, 0.001, integer=True, unit="clients")
    assert (exact.capacity, exact.limit_rate) == (capacity, capacity + 1)  # (a tight --tol: to the client)
    tried = [n for n, _ in out.trail]
    assert all(isinstance(n, int) and n >= 1 for n in tried) and len(tried) == len(set(tried))


def test_an_integer_search_says_clients_and_stops_at_one_and_at_its_cap():
    none = search(step(0), {"p99_ttft_ms": 100}, 8, integer=True, unit="clients")
    assert none.status == FAIL and none.capacity == 0.0 and none.limit_rate == 1
    assert none.limit_reason == "fails even at 1 client: p99_ttft_ms 1000 > 100"
    capped = search(step(10**6), {"p99_ttft_ms": 100}, 16, integer=True, unit="clients", cap=99)
    assert capped.capacity == 99 and capped.limit_rate is None and max(n for n, _ in capped.trail) == 99
    assert capped.limit_reason == "every SLO met up to 99 clients, the most this search may try"


CLOSED = {
    "name": "closed-plan", "model": "llama-3-8b", "hardware": "h100-sxm", "policy": {"name": "chunked_prefill"},
    "workload": {"num_requests": 300, "arrival": {"process": "closed", "concurrency": 8, "think_time_s": 0},
                 "prompt_tokens": {"dist": "lognormal", "median": 600, "p90": 2000, "max": 4000},
                 "output_tokens": {"dist": "lognormal", "median": 60, "p90": 200, "max": 400}},
}


def test_a_closed_loop_plan_searches_clients_and_prices_their_throughput(tmp_path):
    spec = PlanSpec(slos={"p90_ttft_ms": 300.0, "p90_tpot_ms": 25.0}, policies=("continuous", "chunked_prefill"),
                    target_rate=20.0, seeds=1)
    import yaml

    path = tmp_path / "closed.yaml"
    path.write_text(yaml.safe_dump(CLOSED))
    res = plan(scenario_from_dict(CLOSED), spec, tmp_path / "p", executor="serial", source=(str(path), ()))
    f = res.frame.set_index("config")
    for label in ("h100-sxm tp1 continuous", "h100-sxm tp1 chunked_prefill"):
        r = f.loc[label]
        assert r["status"] == "ok" and float(r["capacity_clients"]).is_integer() and r["capacity_clients"] >= 1
        assert r["limit_clients"] - r["capacity_clients"] <= max(1, 0.05 * r["capacity_clients"])
        # the capacity in req/s is the throughput those clients got, and the fleet is sized by it
        assert r["replicas"] * r["capacity_rps"] >= 20.0 > (r["replicas"] - 1) * r["capacity_rps"]
        assert r["capacity_rps_per_gpu"] == pytest.approx(r["capacity_rps"])
        assert r["p90_ttft_ms"] <= 300.0 and r["p90_tpot_ms"] <= 25.0
        # (one seed: the throughput has no interval; the clients' search interval is in clients)
        assert r["capacity_estimate_rps"] == r["capacity_rps"] and r["capacity_high_rps"] is None
        assert "--set workload.arrival.concurrency=" in r["reproduce"] and "arrival.rate" not in r["reproduce"]
        n = int(r["capacity_clients"])  # (the burst at t=0 and the wind-down are left out of the window)
        assert f'"cooldown_requests": {n}, "warmup_requests": {n}' in r["reproduce"]
    # the reproduce command runs the point the row reports
    from batchsim.app.config import load_scenario
    from batchsim.app.runner import run_scenario
    import shlex

    r = f.loc["h100-sxm tp1 chunked_prefill"]
    args = shlex.split(r["reproduce"])
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    s = run_scenario(load_scenario(args[2], sets), keep_steps=False).summary
    n = int(r["capacity_clients"])  # (steady state: N clients / (mean E2E + think time))
    assert r["capacity_rps"] == pytest.approx(n / (s["mean_e2el_ms"] / 1000.0))
    assert r["capacity_rps"] >= s["request_throughput"]  # (the run's own figure carries its drain)
    # (its output tokens/s is that rate times the workload's mean output, as $/1M output tokens prices it)
    from batchsim.app.runner import build_parts

    mean_out = float(build_parts(load_scenario(args[2], sets)).workload.output_tokens.mean())
    assert r["output_tok_s"] == pytest.approx(r["capacity_rps"] * mean_out)
    assert r["usd_per_1m_output_tokens"] == pytest.approx(r["usd_per_hour"] / (20.0 * mean_out * 3600) * 1e6)
    assert s["p90_ttft_ms"] == pytest.approx(r["p90_ttft_ms"])


def pd_float(v):
    return None if v != v else float(v)  # (NaN: none)


def test_the_measured_window_can_leave_out_the_first_and_last_arrivals():
    import numpy as np

    from batchsim.sim.metrics import in_window

    arrival = np.array([0.0, 0.0, 0.0, 1.0, 2.0, 2.5, 3.0, 4.0])
    assert in_window(arrival, 0.0, 0.0).all()
    assert list(in_window(arrival, 0.0, 0.0, 3, 2)) == [False] * 3 + [True] * 3 + [False] * 2
    assert list(in_window(arrival, 1.5, 0.0, 1, 0)) == [False] * 4 + [True] * 4  # (time and count rules both)
    assert not in_window(arrival, 0.0, 0.0, 5, 5).any()
    unsorted = np.array([3.0, 0.0, 2.0, 1.0])  # (a closed loop's send times need not follow rid order)
    assert list(in_window(unsorted, 0.0, 0.0, 1, 1)) == [False, False, True, True]


def test_a_short_closed_loop_run_gives_the_steady_state_throughput_of_a_long_one():
    """The response-time law on a short run's measured requests against a long run's completions per
    second: the run's request_throughput (first arrival to last completion) is biased low by about
    one end-to-end time over the window, which a capacity must not carry."""
    import numpy as np

    from batchsim.app.runner import build_parts, simulate
    from batchsim.sim.metrics import closed_loop_throughput

    def run(n, clients=24):
        raw = {**CLOSED, "seed": 1, "measure": {"warmup_requests": clients, "cooldown_requests": clients},
               "workload": {**CLOSED["workload"], "num_requests": n,
                            "arrival": {"process": "closed", "concurrency": clients, "think_time_s": 0.05}}}
        sc = scenario_from_dict(raw)
        return simulate(sc, build_parts(sc))

    long = run(2000)
    comp = np.sort(long.requests["completion"].to_numpy())
    steady = (len(comp[400:-400]) - 1) / (comp[-401] - comp[400])  # completions per second mid-run
    short = run(400).summary  # (as a plan's points: a few hundred requests, N warm-up and N cool-down)
    law = closed_loop_throughput(24, short["mean_e2el_ms"] / 1000.0, 0.05)
    # (measured: law +5%, request_throughput -12% against the long run's 21.1 req/s)
    assert law == pytest.approx(steady, rel=0.08)
    assert abs(law / steady - 1) < 0.5 * abs(short["request_throughput"] / steady - 1)


def test_a_short_run_is_not_planned_at_a_rate_whose_requests_arrive_as_one_burst(tmp_path):
    """100 requests at 1.4 million req/s all arrive before the first finishes and, served as one
    burst, meet a loose TTFT SLO: such a point measures no rate (the burst gate fails it). A point whose
    arrivals span less than a steady state needs runs again with more requests, so the capacity is
    that of sustained runs: before points were lengthened this plan said 76.6 req/s from 100-request
    points, where 3,000-request runs saturate near 59 req/s."""
    import pandas as pd

    from batchsim.app.capacity.planner import decision_lines, problem_lines
    from batchsim.app.capacity.search import BURST, FAIL, judge_gates

    status, why = judge_gates({"arrival_span_s": 0.5, "median_e2el_ms": 900.0}, 1, False)
    assert status == FAIL and BURST in why and "raise workload.num_requests" in why
    raw = {"name": "short", "model": "llama-3-8b", "hardware": "h100-sxm", "engine_preset": "vllm-v1", "seed": 1,
           "workload": {"num_requests": 100, "arrival": {"process": "poisson", "rate": 8},
                        "prompt_tokens": {"dist": "lognormal", "median": 400, "p90": 1200, "max": 3000},
                        "output_tokens": {"dist": "fixed", "value": 64}}}
    spec = PlanSpec(slos={"p99_ttft_ms": 2000.0}, policies=("chunked_prefill",), seeds=1, max_requests=5000)
    res = plan(scenario_from_dict(raw), spec, tmp_path / "p", executor="serial")
    row = res.frame.iloc[0]
    assert row["status"] == "ok" and 50 < row["capacity_rps"] < 66  # (it was 1,435,238 req/s, then 76.6)
    # (the output tokens/s at capacity: its rate times the 64 tokens each request generates, not the
    # run's output_throughput, which a run's drain pulls below it)
    assert row["output_tok_s"] == pytest.approx(64 * row["capacity_rps"])
    assert row["point_requests"] > 1000 and row["steady_share"] >= 1.0 and row["lengthened_rates"] >= 1
    assert not any(line.startswith("SHORT ") for line in problem_lines(pd.DataFrame([row.to_dict()])))
    assert any(line.startswith("longer points: ") for line in decision_lines(res))
    # with the points held to the workload's 100 requests the capacity is a short run's, and says so; by
    # default (up to 10 x 100 requests) a point at the cap is still short, and says with how many it ran
    for most, low, high in ((100, 70, 90), (None, 60, 76)):
        short = plan(scenario_from_dict(raw), PlanSpec(slos={"p99_ttft_ms": 2000.0}, policies=("chunked_prefill",),
                                                       seeds=1, max_requests=most), tmp_path / f"q{most}",
                     executor="serial")
        row = short.frame.iloc[0]
        assert row["status"] == "ok" and low < row["capacity_rps"] < high and row["steady_share"] < 1.0
        (line,) = [x for x in problem_lines(pd.DataFrame([row.to_dict()])) if x.startswith("SHORT ")]
        assert ("with 1000 requests (the most --max-requests allows)" in line) == (most is None), line


def test_a_closed_loop_capacity_in_req_s_carries_its_own_interval(tmp_path):
    """Over seeds the throughput at the capacity's clients is known to an interval: the response-time
    law carried through the ends of the mean E2E's 95% interval; the capacity in req/s (what a target
    rate is sized by) is its low end, as a rate plan's is, and the table shows both intervals."""
    from batchsim.reports.capacity import plan_page
    from batchsim.reports.stats import CI_SUFFIX

    # (an SLO on the mean E2E no run misses puts it and its interval in the table)
    spec = PlanSpec(slos={"p90_ttft_ms": 300.0, "mean_e2el_ms": 1e9}, policies=("chunked_prefill",),
                    target_rate=20.0, seeds=3, max_seeds=3)
    res = plan(scenario_from_dict(CLOSED), spec, tmp_path / "p", executor="serial")
    r = res.frame.iloc[0]
    n, e2e, half = float(r["capacity_clients"]), r["mean_e2el_ms"], r["mean_e2el_ms" + CI_SUFFIX]
    assert r["status"] == "ok" and r["seeds"] == 3 and half > 0
    assert r["capacity_estimate_rps"] == pytest.approx(n / (e2e / 1000.0))
    assert r["capacity_rps"] == pytest.approx(n / ((e2e + half) / 1000.0))
    assert r["capacity_high_rps"] == pytest.approx(n / ((e2e - half) / 1000.0))
    assert r["replicas"] * r["capacity_rps"] >= 20.0 > (r["replicas"] - 1) * r["capacity_rps"]
    text = plan_page(res.frame, res.info, list(spec.slos), spec.pareto_metric, spec.target_rate)
    assert "throughput 95% interval" in text and "clients 95% interval" in text
    assert f"{r['capacity_rps']:.2f}–{r['capacity_high_rps']:.2f} ({r['capacity_estimate_rps']:.2f})" in text


def test_an_undecided_closed_loop_says_its_clients():
    import pandas as pd

    from batchsim.app.capacity.planner import problem_lines

    row = {"config": "c", "status": "SLO not met", "capacity_estimate_rps": None, "capacity_clients_estimate": 6.0}
    (line,) = problem_lines(pd.DataFrame([row]))
    assert line.startswith("UNDECIDED c: no client count meets") and "up to 6 clients" in line


def test_a_closed_loop_capacity_with_rejections_says_what_its_throughput_counts():
    import pandas as pd

    from batchsim.app.capacity.planner import problem_lines

    row = {"config": "c", "status": "ok", "rejected": 3, "seeds": 1, "capacity_clients": 8.0}
    (line,) = problem_lines(pd.DataFrame([row]))
    assert "allowed by --allow-rejections" in line and "only the served requests' cycles" in line
    (line,) = problem_lines(pd.DataFrame([{**row, "capacity_clients": None}]))
    assert "cycles" not in line
