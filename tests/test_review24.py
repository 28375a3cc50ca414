"""Review 24: an overhead override that breaks a check across terms, disaggregated first tokens
through the frontend, and the sweep's served throughput under aggregate records."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import yaml

from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_cost, run_scenario
from batchsim.reports.derive import load_window
from batchsim.sim.errors import InputError

from tests.cli_helpers import run_cli

CLOSED = {
    "name": "r24", "model": "llama-3-8b", "hardware": "h100-sxm", "policy": {"name": "continuous", "max_num_seqs": 64},
    "workload": {"num_requests": 40, "arrival": {"process": "closed", "concurrency": 4, "think_time_s": 0.05},
                 "prompt_tokens": {"dist": "lognormal", "median": 300, "p90": 900, "max": 2000},
                 "output_tokens": {"dist": "lognormal", "median": 30, "p90": 80, "max": 200}},
    "seed": 1,
}


def _scenario(**changes) -> dict:
    data = copy.deepcopy(CLOSED)
    data.update(copy.deepcopy(changes))
    return data


# -- 1. a host override below the profile's per-step term ------------------------------------------
def test_a_decode_step_term_below_the_step_term_is_an_input_error_naming_overheads_host():
    # (h100-sxm's per_step_us is 250: each term is in its bounds, their sum is not)
    sc = scenario_from_dict(_scenario(overheads={"host": {"per_decode_step_us": -500}}))
    with pytest.raises(InputError) as e:
        build_cost(sc)
    assert e.value.where == "overheads.host"
    assert "per_step_us + per_decode_step_us must be >= 0" in e.value.message
    assert "250.0 + -500.0" in e.value.message and "h100-sxm" in e.value.message


def test_the_cli_exits_2_with_one_line_for_a_decode_step_term_below_the_step_term(capsys, monkeypatch, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_scenario()))
    code, out, err = run_cli(capsys, monkeypatch, "run", str(path), "--set", "overheads.host.per_decode_step_us=-500",
                             "--out", str(tmp_path / "out"))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert "overheads.host" in lines[0] and "per_decode_step_us" in lines[0] and "-500" in lines[0]


def test_a_decode_step_term_the_step_term_covers_still_runs():
    sc = scenario_from_dict(_scenario(overheads={"host": {"per_decode_step_us": -250}}))
    assert build_cost(sc).hardware.host_overhead.per_decode_step_us == -250


# -- 2. disaggregated, first_token prefill: the first token goes through the frontend's out server ---
FRONTEND = {"frontend": {"per_request_us": 2000, "per_prompt_token_us": 10, "per_step_us": 300,
                         "per_output_token_us": 50}}
DISAGG = {"prefill": {"replicas": 1, "policy": {"name": "chunked_prefill", "max_num_batched_tokens": 2048}},
          "decode": {"replicas": 1}, "link": {"bandwidth_gbps": 400, "latency_us": 10}}


@pytest.mark.parametrize("first_token", ["prefill", "decode"])
@pytest.mark.parametrize("output", [None, 1])
def test_disaggregated_first_tokens_reach_the_client_through_the_frontend(first_token, output):
    # one client at a time: the frontend is never busy, so each token costs per_step + per_output_token
    # (0.35 ms) more than without one, past frontend_in, as in a colocated run
    changes = {"disaggregation": {**DISAGG, "first_token": first_token}}
    if output is not None:
        changes["workload"] = {**CLOSED["workload"], "output_tokens": {"dist": "fixed", "value": output}}
    changes["workload"] = {**changes.get("workload", CLOSED["workload"]),
                           "arrival": {"process": "closed", "concurrency": 1, "think_time_s": 0.0}, "num_requests": 12}
    plain = run_scenario(scenario_from_dict(_scenario(**changes))).requests.sort_values("rid")
    fe = run_scenario(scenario_from_dict(_scenario(overheads=FRONTEND, **changes))).requests.sort_values("rid")
    assert (fe.status == "completed").all()
    out_s = 300e-6 + 50e-6
    np.testing.assert_allclose((fe.ttft - plain.ttft - fe.frontend_in_s).to_numpy(), out_s, rtol=0, atol=1e-9)
    np.testing.assert_allclose((fe.e2el - plain.e2el - fe.frontend_in_s).to_numpy(), out_s, rtol=0, atol=1e-9)
    # the TTFT split still adds up: the out server's time is the part after the KV's arrival
    first = fe.first_token - fe.transfer_end
    assert (first >= out_s - 1e-12).all()


# -- 3. the load window's served tokens ------------------------------------------------------------
OPEN = _scenario(workload={"num_requests": 300, "arrival": {"process": "poisson", "rate": 20},
                           "prompt_tokens": {"dist": "lognormal", "median": 300, "p90": 900, "max": 2000},
                           "output_tokens": {"dist": "lognormal", "median": 60, "p90": 200, "max": 400}},
                 overheads={"frontend": {"per_request_us": 1500, "per_prompt_token_us": 3, "per_step_us": 200,
                                         "per_output_token_us": 30}})


def _served(data: dict, records: str) -> tuple[dict, object]:
    data = copy.deepcopy(data)
    data.setdefault("measure", {})["records"] = records
    res = run_scenario(scenario_from_dict(data))
    return load_window(res.requests, res.itl), res


def _delivered_in_window(res, skip: float = 0.25) -> float:
    """Served tokens/s by hand: each request's tokens at its runs' token steps, one by one."""
    r, itl = res.requests, res.itl
    a = r.arrival.to_numpy(float)
    lo, hi = a.min() + skip * (a.max() - a.min()), a.max()
    ft = r.first_token.to_numpy(float)
    n = int(((ft >= lo) & (ft <= hi)).sum())
    for k in range(len(itl.rid)):
        t = itl.times[itl.replica[k]][itl.start[k]:itl.end[k] + 1]
        t = t[1:] if np.isnan(itl.entry[k]) else t  # (its first token is the request's first_token)
        n += int(((t >= lo) & (t <= hi)).sum())
    return n / (hi - lo)


@pytest.mark.parametrize("data", [OPEN, _scenario(workload={**CLOSED["workload"], "num_requests": 200,
                                                            "arrival": {"process": "closed", "concurrency": 64,
                                                                        "think_time_s": 0.5}})],
                         ids=["open", "closed64"])
def test_served_throughput_is_the_same_with_aggregate_records(data):
    full, res = _served(data, "full")
    agg, _ = _served(data, "aggregate")
    assert full == agg
    assert full["served_output_throughput"] == pytest.approx(_delivered_in_window(res), rel=1e-12)
    # (it keeps up: far from the 1.2% the step-record count gave under aggregate records)
    assert full["served_output_throughput"] > 0.8 * full["offered_output_throughput"]


def test_a_one_token_last_chunk_is_not_counted_twice():
    # prompts of 257 tokens under a 256-token budget: a last chunk of one token over 256 cached,
    # billed as a decode row, samples the first token
    wl = {"num_requests": 6, "arrival": {"process": "closed", "concurrency": 1, "think_time_s": 0.0},
          "prompt_tokens": {"dist": "fixed", "value": 257}, "output_tokens": {"dist": "fixed", "value": 3}}
    data = _scenario(policy={"name": "chunked_prefill", "max_num_batched_tokens": 256}, workload=wl)
    w, res = _served(data, "full")
    assert res.steps["decode_tokens"].sum() + res.requests.first_token.notna().sum() > res.requests.generated_tokens.sum()
    assert w["served_output_throughput"] == pytest.approx(_delivered_in_window(res), rel=1e-12)
    # the window holds whole requests only (one client, none thinking): 3 tokens each
    r = res.requests
    a = r.arrival.to_numpy(float)
    lo, hi = a.min() + 0.25 * (a.max() - a.min()), a.max()
    inside = r[(r.first_token >= lo) & (r.last_token <= hi)]
    outside_tokens = w["served_output_throughput"] * (hi - lo) - 3 * len(inside)
    assert 0 <= outside_tokens <= 3


def test_a_prefix_cache_hit_that_leaves_one_token_is_not_counted_twice():
    # 497-token prompts sharing one prefix: after the first, 496 tokens (31 blocks of 16) are cached
    # and the one left, billed as a decode row, samples the first token
    wl = {"num_requests": 10, "arrival": {"process": "closed", "concurrency": 1, "think_time_s": 0.0},
          "prompt_tokens": {"dist": "fixed", "value": 497}, "output_tokens": {"dist": "fixed", "value": 4},
          "shared_prefix": {"groups": 1, "tokens": 497, "block_tokens": 16}}
    data = _scenario(policy={"name": "continuous", "enable_prefix_caching": True, "block_size": 16}, workload=wl)
    w, res = _served(data, "full")
    assert (res.requests.cached_tokens.iloc[1:] == 496).all()
    assert res.steps["decode_tokens"].sum() + res.requests.first_token.notna().sum() > res.requests.generated_tokens.sum()
    assert w["served_output_throughput"] == pytest.approx(_delivered_in_window(res), rel=1e-12)
    assert _served(data, "aggregate")[0] == w


def test_disaggregated_decode_recomputes_are_not_counted_as_tokens():
    # first_token decode: the decode replica's first row (one prompt token over the rest) samples the
    # first token; the step records bill it as a decode
    data = _scenario(disaggregation={**DISAGG, "first_token": "decode"})
    w, res = _served(data, "full")
    assert w["served_output_throughput"] == pytest.approx(_delivered_in_window(res), rel=1e-12)
    agg, _ = _served(data, "aggregate")
    assert agg == w


def test_sweep_with_aggregate_records_does_not_mark_every_point_saturated(capsys, monkeypatch, tmp_path):
    path = tmp_path / "open.yaml"
    path.write_text(yaml.safe_dump(OPEN))
    rows = {}
    for records in ("full", "aggregate"):
        out = tmp_path / records
        code, _, err = run_cli(capsys, monkeypatch, "sweep", str(path), "--rates", "2,4", "--policies", "continuous",
                               "--seeds", "1", "--out", str(out), "--set", f"measure.records={records}")
        assert code == 0, err
        rows[records] = [line.split(",")[:6] for line in (out / "sweep.csv").read_text().splitlines()[1:]]
    assert rows["full"] == rows["aggregate"]
    assert all(r[5] == "False" for r in rows["aggregate"])
