"""Closed-loop clients (``workload.arrival: {process: closed, concurrency: N, think_time_s: Z}``):
N clients, each sending its next request when its last one ends, after a think time."""

from __future__ import annotations

import numpy as np
import pytest

from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import run_scenario
from batchsim.sim.errors import InputError


def _scenario(concurrency: int = 4, think: float = 0.0, dist: str = "constant", n: int = 200, **extra) -> dict:
    data = {
        "name": "closed", "model": "llama-3-8b", "hardware": "h100-sxm",
        "policy": {"name": "continuous", "max_num_seqs": 256},
        "workload": {"num_requests": n,
                     "arrival": {"process": "closed", "concurrency": concurrency, "think_time_s": think,
                                 "think": dist},
                     "prompt_tokens": {"dist": "lognormal", "median": 300, "p90": 900, "max": 2000},
                     "output_tokens": {"dist": "lognormal", "median": 60, "p90": 200, "max": 400}},
        "seed": 1,
    }
    data.update(extra)
    return data


def _run(data: dict):
    return run_scenario(scenario_from_dict(data), None)


def test_one_client_sends_each_request_when_the_last_ends_plus_its_think_time():
    res = _run(_scenario(concurrency=1, think=0.25, n=30))
    r = res.requests.sort_values("rid")
    assert (r["status"] == "completed").all() and r["arrival"].iloc[0] == 0.0
    np.testing.assert_array_equal(r["arrival"].to_numpy()[1:], r["completion"].to_numpy()[:-1] + 0.25)
    assert res.summary["engine"] == "python" and "closed-loop" in res.summary["engine_reason"]


def _in_flight(req) -> np.ndarray:
    """Requests in flight just after each arrival."""
    a, c = req["arrival"].to_numpy(), req["completion"].to_numpy()
    return np.array([int(((a <= t) & (c > t)).sum()) for t in a])


def test_never_more_than_the_concurrency_in_flight_and_exactly_that_without_think_time():
    req = _run(_scenario(concurrency=8, think=0.0, n=200)).requests
    flight = _in_flight(req)
    assert flight.max() == 8
    # with no think time every client always has one request in flight until the requests run out
    last_first_wave = req.sort_values("arrival")["arrival"].iloc[-8]
    assert (flight[req["arrival"].to_numpy() < last_first_wave] == 8).all()


def test_littles_law_requests_in_flight_are_the_concurrency_less_the_thinking_share():
    n_clients, think = 8, 0.5
    res = _run(_scenario(concurrency=n_clients, think=think, dist="exponential", n=400))
    req = res.requests
    assert (req["status"] == "completed").all()
    span = float(req["completion"].max() - req["arrival"].min())
    in_flight = float((req["completion"] - req["arrival"]).sum()) / span  # L = time-average requests in system
    throughput = len(req) / span  # X
    # Little's law on the clients: N = L + X * Z (each client is either waiting on a response or thinking);
    # the last requests' tails make it approximate, not exact
    assert in_flight == pytest.approx(n_clients - throughput * think, rel=0.03)
    assert in_flight < n_clients * 0.95  # thinking clients are not in flight


def test_throughput_saturates_as_clients_are_added():
    """A concurrency sweep (1 .. 512 clients, 1500 requests each): throughput follows the clients
    while the replica has room, then flattens (measured: 1.59, 5.82, 17.9, 38.8, 57.5, 57.6 req/s)
    while the time to first token explodes (queueing)."""
    x, ttft = {}, {}
    for c in (1, 4, 16, 64, 256, 512):
        s = _run(_scenario(concurrency=c, n=1500)).summary
        x[c], ttft[c] = s["request_throughput"], s["median_ttft_ms"]
    assert x[4] > 2.5 * x[1] and x[16] > 2.0 * x[4]  # far below saturation: throughput follows the clients
    assert x[512] < 1.02 * x[256]  # saturated: more clients only queue
    assert ttft[512] > 10 * ttft[256]


def test_closed_loop_runs_are_deterministic_and_seeded():
    a = _run(_scenario(concurrency=6, think=0.1, dist="exponential", n=120)).requests
    b = _run(_scenario(concurrency=6, think=0.1, dist="exponential", n=120)).requests
    c = _run({**_scenario(concurrency=6, think=0.1, dist="exponential", n=120), "seed": 2}).requests
    assert a.equals(b) and not a["arrival"].equals(c["arrival"])


def test_a_rejected_request_frees_its_client_and_a_horizon_stops_the_clients():
    data = _scenario(concurrency=2, n=60)
    data["policy"]["max_model_len"] = 600  # some requests are too long: rejected at once
    req = _run(data).requests
    assert (req["status"] == "rejected").any() and len(req) == 60 and set(req["status"]) <= {"completed", "rejected"}
    cut = _run({**_scenario(concurrency=2, n=500), "horizon_s": 3.0})
    sent = cut.requests
    assert 0 < len(sent) < 500 and (sent["arrival"] < 3.0).all()  # requests never sent are not records
    assert set(sent["status"]) <= {"completed", "unfinished"}


@pytest.mark.parametrize("change, field", [
    ({"num_requests": None, "duration_s": 10.0}, "workload"),
    ({"duration_s": 10.0}, "workload"),
])
def test_closed_loop_config_errors(change, field):
    data = _scenario()
    data["workload"].update(change)
    with pytest.raises(InputError) as e:
        scenario_from_dict(data)
    assert field in str(e.value)


def test_concurrency_must_be_a_positive_whole_number():
    for bad in (0, True, 1.5):
        data = _scenario()
        data["workload"]["arrival"]["concurrency"] = bad
        with pytest.raises(InputError) as e:
            scenario_from_dict(data)
        assert "workload.arrival" in str(e.value) and "concurrency" in str(e.value)


def test_aggregate_records_run_a_closed_loop_and_engine_core_says_why_it_cannot():
    # (the gap records select the measured requests after the run, so aggregate records can)
    full = _run(_scenario()).summary
    agg = _run({**_scenario(), "measure": {"records": "aggregate"}}).summary
    assert {k: v for k, v in agg.items() if k != "provenance"} == {k: v for k, v in full.items() if k != "provenance"}
    with pytest.raises(InputError) as e:
        _run({**_scenario(), "engine": "core"})
    assert "closed-loop" in e.value.message and e.value.where == "engine"


@pytest.mark.parametrize("policy", [{"name": "static", "max_batch_size": 4},
                                    {"name": "dynamic", "max_batch_size": 4, "max_queue_delay_s": 0.05}])
def test_a_batch_that_returns_together_ends_its_requests_when_it_returns(policy):
    """static/dynamic with complete_at: batch_end hold finished requests until the batch returns:
    the client has its response then (its completion), not at the request's own last token."""
    data = _scenario(concurrency=1, think=0.1, n=12)
    data["policy"] = policy
    r = _run(data).requests.sort_values("rid")
    np.testing.assert_allclose(r["arrival"].to_numpy()[1:], r["completion"].to_numpy()[:-1] + 0.1, rtol=0, atol=1e-12)
    many = {**_scenario(concurrency=5, n=80), "policy": policy}
    assert _in_flight(_run(many).requests).max() <= 5


def test_a_closed_loop_warns_of_rejections_and_of_a_horizon_that_stopped_its_clients():
    s = _run({**_scenario(concurrency=3, n=50), "max_queue_len": 1}).summary
    assert any("rejected in a closed loop" in w for w in s["warnings"]), s["warnings"]
    s = _run({**_scenario(concurrency=2, n=400), "horizon_s": 3.0}).summary
    assert any(w.startswith("horizon_s stopped the clients:") and "of 400 requests were sent" in w
               for w in s["warnings"]), s["warnings"]


def test_think_times_that_would_overflow_the_clock_are_an_error():
    with pytest.raises(InputError) as e:
        _run(_scenario(concurrency=1, think=1e17, n=3))
    assert e.value.where == "workload.arrival.think_time_s"


def test_a_concurrency_sweep_finds_where_throughput_levels_off(tmp_path):
    from batchsim.app.sweep import sweep

    sc = scenario_from_dict({
        "name": "cl", "model": "llama-3-8b", "hardware": "h100-sxm",
        "policy": {"name": "chunked_prefill", "max_num_seqs": 64, "max_num_batched_tokens": 2048},
        "workload": {"num_requests": 400, "arrival": {"process": "closed", "concurrency": 4, "think_time_s": 0.0},
                     "prompt_tokens": {"dist": "fixed", "value": 500}, "output_tokens": {"dist": "fixed", "value": 100}}})
    res = sweep(sc, None, ["chunked_prefill"], seeds=1, concurrency=[1, 4, 16, 64, 128], show_progress=False)
    f = res.frame
    assert list(f["concurrency"]) == [1, 4, 16, 64, 128] and "rate" not in f.columns
    served = f["served_output_throughput"].to_numpy()
    assert served[2] > 3 * served[0]  # more clients, more throughput, until max_num_seqs (64) runs out
    at = res.saturation["chunked_prefill"]
    assert at == 64  # 128 clients cannot run more than 64 at once: throughput levels off at 64
    assert f.loc[f["concurrency"] == 128, "median_ttft_ms"].iloc[0] > 2 * f.loc[f["concurrency"] == 64, "median_ttft_ms"].iloc[0]
    with pytest.raises(InputError, match="--concurrency"):
        sweep(sc, None, ["chunked_prefill"], seeds=1, concurrency=[1000], show_progress=False)


def test_a_closed_loop_cut_short_without_a_horizon_does_not_blame_the_horizon():
    """Clients that stop because their requests never end (a stalled replica) are not 'stopped by
    horizon_s' when no horizon was set."""
    from batchsim.app.runner import _closed_loop_warnings
    from batchsim.sim.table import Table

    req = Table({"status": np.array(["completed"], dtype=object)})
    wl = type("W", (), {"__len__": lambda self: 5})()
    assert _closed_loop_warnings(req, wl, 3, None) == [
        "the clients stopped, each waiting on a request that never ended: 3 of 5 requests were sent"]
    assert _closed_loop_warnings(req, wl, 3, 10.0) == ["horizon_s stopped the clients: 3 of 5 requests were sent"]
