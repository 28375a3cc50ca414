"""Frontend and host overhead terms (batchsim.sim.frontend, HostOverhead.per_tp_rank_us), by hand.

The frontend is two first-come-first-served servers in front of and behind the engine: a
request reaches the queue after ``per_request + per_prompt_token * prompt`` of frontend time
(waiting for earlier requests), and a step's tokens reach their clients after ``per_step +
per_output_token * tokens`` (waiting for earlier steps). Both engines run the same rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from batchsim import core
from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, simulate
from batchsim.sim.frontend import delivered_at, engine_arrivals, tokenized_at


def test_the_in_server_queues_requests_in_order():
    # 1 ms per request + 10 us per prompt token; requests at 0, 0, 5 ms with 100-token prompts
    t = engine_arrivals(np.array([0.0, 0.0, 0.005]), np.array([100, 100, 100]), 1e-3, 1e-5)
    assert t == pytest.approx([0.002, 0.004, 0.007])
    assert tokenized_at(1.0, 0, 0.5, 0.0, 0.0) == 1.0
    assert delivered_at(1.0, 1.5, 4, 1e-3, 1e-4) == pytest.approx(1.5014)


def _scenario(**over) -> dict:
    raw = {"name": "fe", "model": "llama-3-8b", "hardware": "h100-sxm",
           "policy": {"name": "chunked_prefill", "max_num_seqs": 64, "max_num_batched_tokens": 1024},
           "workload": {"num_requests": 200, "arrival": {"process": "poisson", "rate": 6.0},
                        "prompt_tokens": {"dist": "fixed", "value": 400},
                        "output_tokens": {"dist": "fixed", "value": 50}}}
    raw.update(over)
    return raw


def _run(raw):
    sc = scenario_from_dict(raw)
    return simulate(sc, build_parts(sc))


FRONTEND = {"frontend": {"per_request_us": 2000, "per_prompt_token_us": 5, "per_step_us": 300,
                         "per_output_token_us": 40}}


def test_frontend_terms_add_their_time_to_ttft_and_e2el_but_not_to_the_gaps():
    base = _run(_scenario(engine="python"))
    fe = _run(_scenario(engine="python", overheads=FRONTEND))
    a, b = base.requests, fe.requests
    assert (a["arrival"].to_numpy() == b["arrival"].to_numpy()).all()  # the client's send times
    # in: 2 ms + 5 us x 400 = 4 ms, at 6 req/s the frontend is never busy with another request
    assert b["frontend_in_s"].median() == pytest.approx(0.004)  # (a request sent just after another waits)
    assert b["frontend_in_s"].min() >= 0.004 - 1e-12
    # TTFT and E2E grow by at least the in time plus one step's delivery (300 us + 40 us per token)
    assert (b["ttft"] - a["ttft"]).median() >= 0.004 + 0.00034 - 1e-9
    assert (b["e2el"] - a["e2el"]).median() >= 0.004 + 0.00034 - 1e-9
    # at this load delivery never queues behind a step, so per-token gaps stay near the engine's
    assert abs(b["tpot"].median() - a["tpot"].median()) < 0.05 * a["tpot"].median()
    assert "frontend_in_s" not in a.columns
    assert fe.summary["overheads"]["frontend"]["per_request_us"] == 2000
    assert "overheads" not in base.summary


def test_a_saturated_frontend_delays_tokens_more_as_rows_grow():
    # 10 ms per emitted token: a few rows need more streaming time per step than a decode step takes
    slow = {"frontend": {"per_output_token_us": 10000}}
    r = _run(_scenario(engine="python", overheads=slow))
    base = _run(_scenario(engine="python"))
    assert r.requests["tpot"].median() > 2 * base.requests["tpot"].median()


@pytest.mark.skipif(core.library() is None, reason="no compiled core here")
@pytest.mark.parametrize("policy", [
    {"name": "chunked_prefill", "max_num_seqs": 64, "max_num_batched_tokens": 1024},
    {"name": "continuous", "max_num_seqs": 32},
    {"name": "static", "max_batch_size": 8, "timeout_s": 0.2},
    {"name": "dynamic", "max_batch_size": 8, "max_queue_delay_s": 0.05, "complete_at": "own_token"},
])
def test_both_engines_apply_the_frontend_alike(policy):
    outs = []
    for engine in ("python", "core"):
        r = _run(_scenario(engine=engine, policy=policy, overheads=FRONTEND))
        assert r.summary["engine"] == engine
        outs.append((r.requests.to_csv(), r.steps.to_csv(), r.itl.frame().to_csv()))
    assert outs[0] == outs[1]


def test_the_tp_rank_term_adds_to_every_step_at_tp_above_one():
    one = _run(_scenario(tensor_parallel_size=2, engine="python"))
    more = _run(_scenario(tensor_parallel_size=2, engine="python", overheads={"host": {"per_tp_rank_us": 500}}))
    # per step: 500 us x (2 - 1) more overhead
    steps_a, steps_b = one.steps, more.steps
    assert steps_b["overhead_s"].iloc[0] - steps_a["overhead_s"].iloc[0] == pytest.approx(5e-4)
    assert more.summary["overheads"]["host"]["per_step_us_at_tp"] == pytest.approx(250 + 500)


def test_closed_loop_clients_wait_for_the_frontend_both_ways():
    wl = {"num_requests": 60, "arrival": {"process": "closed", "concurrency": 4, "think_time_s": 0.0},
          "prompt_tokens": {"dist": "fixed", "value": 200}, "output_tokens": {"dist": "fixed", "value": 20}}
    r = _run(_scenario(engine="python", workload=wl, overheads=FRONTEND))
    req = r.requests.sort_values("arrival")
    assert (req["status"] == "completed").all()
    assert (req["frontend_in_s"] >= 0.002 + 0.001 - 1e-12).all()
    # with no think time, each client's next send is at its last response's completion
    per_client_gaps = np.diff(np.sort(req["arrival"].to_numpy()))
    assert per_client_gaps.min() >= 0.0


def test_overhead_fields_are_checked():
    from batchsim.sim.errors import InputError

    with pytest.raises(InputError, match="per_request_us"):
        scenario_from_dict(_scenario(overheads={"frontend": {"per_request_us": -1}}))
    with pytest.raises(InputError, match="overheads.frontend"):
        scenario_from_dict(_scenario(overheads={"frontend": {"tokenize_us": 1}}))


def test_each_replica_has_its_frontend():
    slow = {"frontend": {"per_request_us": 100000}}  # 0.1 s a request: one process serves 10 req/s
    wl = {"num_requests": 300, "arrival": {"process": "poisson", "rate": 30.0},
          "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 10}}
    one = _run(_scenario(engine="python", workload=wl, overheads=slow))
    four = _run(_scenario(engine="python", workload=wl, overheads=slow, replicas=4, router="least_outstanding"))
    assert one.requests["frontend_in_s"].mean() > 5.0  # 30 req/s into 10 req/s of frontend: it queues
    assert four.requests["frontend_in_s"].mean() < 0.5  # four processes serve 40 req/s


@pytest.mark.parametrize("engine", ["python", "core"])
def test_at_the_horizon_only_what_the_clients_have_counts(engine):
    if engine == "core" and core.library() is None:
        pytest.skip("no compiled core here")
    slow_out = {"frontend": {"per_step_us": 20000}}  # 20 ms to stream each step: delivery lags the engine
    r = _run(_scenario(engine=engine, overheads=slow_out, horizon_s=5.0))
    req = r.requests
    for col in ("first_token", "last_token", "completion"):
        assert not (req[col] > 5.0).any(), col
    assert (req.loc[req["status"] == "completed", "completion"] <= 5.0).all()
    assert (req["status"] == "unfinished").sum() > 0
    # requests sent before the horizon but still in the frontend's queue are unfinished, not lost
    slow_in = {"frontend": {"per_request_us": 250000}}
    r = _run(_scenario(engine=engine, overheads=slow_in, horizon_s=10.0))
    sent = int((build_parts(scenario_from_dict(_scenario())).workload.arrival < 10.0).sum())
    assert len(r.requests) == sent
    waiting = r.requests[r.requests["replica"] == -1]
    assert len(waiting) > 0 and (waiting["status"] == "unfinished").all()


def test_closed_loop_clients_sent_into_a_busy_frontend_are_counted_at_the_horizon():
    wl = {"num_requests": 150, "arrival": {"process": "closed", "concurrency": 32, "think_time_s": 0.0},
          "prompt_tokens": {"dist": "fixed", "value": 200}, "output_tokens": {"dist": "fixed", "value": 20}}
    r = _run(_scenario(engine="python", workload=wl, overheads={"frontend": {"per_request_us": 250000}},
                       horizon_s=3.0))
    assert (r.requests["arrival"] < 3.0).all() and len(r.requests) >= 32  # all 32 clients sent at t = 0


@pytest.mark.parametrize("bad", ["per_request_us=inf", "per_step_us=1e308"])
def test_overhead_overrides_out_of_range_are_input_errors(bad):
    from batchsim.sim.errors import InputError

    key, value = bad.split("=")
    with pytest.raises(InputError, match=f"overheads.frontend.{key}"):
        scenario_from_dict(_scenario(overheads={"frontend": {key: float(value)}}))
