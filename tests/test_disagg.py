"""Disaggregated serving (batchsim.sim.disagg): hand-worked timelines, properties, and the scenario path."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import run_scenario
from batchsim.policies import create_policy
from batchsim.sim.aggregate import StepTotals
from batchsim.sim.disagg import DisaggCluster, KVLink, LinkSpec, Livelock
from batchsim.sim.engine import Replica
from batchsim.sim.errors import InputError
from batchsim.sim.itl import TokenSteps
from batchsim.sim.kv import PagedKVCache
from batchsim.sim.records import FrameSteps, StepStream, request_frame
from batchsim.sim.router import make_router

from tests.cli_helpers import run_cli
from tests.engine_helpers import ConstantCost, workload


def run_disagg(wl, prefill=1, decode=1, bandwidth=100.0, latency=0.5, mode="per_request", layers=2,
               first_token="prefill", kv_bytes=10.0, prefill_blocks=1000, decode_blocks=1000, block_size=16,
               decode_policy=None, horizon=None, cost=None, pairing="after_prefill", reserved=0,
               prefill_policy=None, prefill_router="round_robin", max_queue_len=None):
    """The engine alone: constant-time steps, a link of ``bandwidth`` bytes/s per GPU."""
    from batchsim.app.runner import _itl_records

    env = simpy.Environment()
    frame = FrameSteps()
    totals = StepTotals(prefill + decode)
    steps = StepStream(totals, frame)
    cost = cost or ConstantCost(1.0)
    pre = [Replica(env, i, create_policy(prefill_policy or {"name": "continuous"}), cost,
                   PagedKVCache(prefill_blocks, block_size),
                   100_000, steps, TokenSteps()) for i in range(prefill)]
    dec = [Replica(env, prefill + j, create_policy(decode_policy or {"name": "continuous"}), cost,
                   PagedKVCache(decode_blocks, block_size), 100_000, steps, TokenSteps()) for j in range(decode)]
    link = KVLink(LinkSpec(bandwidth, latency, mode, layers), [1] * prefill, [1] * decode)
    rng = np.random.default_rng(0)
    cluster = DisaggCluster(env, pre, make_router(prefill_router, rng), dec, make_router("round_robin", rng),
                            link, wl, kv_bytes, first_token, max_queue_len, pairing=pairing, reserved_tokens=reserved)
    try:
        env.run(until=horizon)
    except Livelock:
        pass
    steps.close()
    req = request_frame(cluster.requests)
    cols = cluster.transfer_columns(req)
    req["decode_admitted"] = req["admitted"]
    for c, v in cols.items():
        req[c] = v
    itl = _itl_records(pre + dec, cluster.requests, len(wl)).frame()
    return req.set_index("rid"), frame.frame(), itl, cluster


TWO = dict(arrivals=[0.0, 0.5], prompts=[10, 25], outputs=[3, 2])


def test_two_requests_first_token_on_prefill():
    """Worked by hand (1 s steps, 10 B/token over 100 B/s, 0.5 s latency):
    r0: prefill [0,1]; transfer 100 B [1,2] + 0.5 -> 2.5 (its first token); decodes end 3.5, 4.5.
    r1 (at 0.5): prefill [1,2]; transfer 250 B [2,4.5] (the egress is free at 2) + 0.5 -> 5.0;
    decode replica idle from 4.5, so its second token is at 6.0."""
    req, steps, itl, cluster = run_disagg(workload(**TWO))
    r0, r1 = req.loc[0], req.loc[1]
    assert (r0.prefill_admitted, r0.prefill_end, r0.transfer_start, r0.transfer_end) == (0, 1, 1, 2.5)
    assert (r0.first_token, r0.completion, r0.ttft, r0.decode_admitted) == (2.5, 4.5, 2.5, 2.5)
    assert (r1.prefill_admitted, r1.prefill_end, r1.transfer_start, r1.transfer_end) == (1, 2, 2, 5.0)
    assert (r1.first_token, r1.completion, r1.ttft) == (5.0, 6.0, 4.5)
    assert list(req.kv_transfer_bytes) == [100.0, 250.0]
    assert list(req.replica) == [1, 1] and list(req.prefill_replica) == [0, 0]
    assert sorted(itl["gap"].tolist()) == [1.0, 1.0, 1.0]
    # prefill steps on replica 0 (the step ending at 2 still holds r0's block: its transfer ends at 2.5)
    pre = steps[steps.replica == 0]
    assert list(zip(pre.start, pre.end)) == [(0, 1), (1, 2)]
    assert list(pre.kv_used_blocks) == [1, 3]
    dec = steps[steps.replica == 1]
    assert list(zip(dec.start, dec.end)) == [(2.5, 3.5), (3.5, 4.5), (5.0, 6.0)]
    assert list(dec.decode_tokens) == [1, 1, 1]
    assert cluster.link.transfers == 2 and cluster.link.bytes == 350.0
    assert cluster.link.out_busy == [3.5]
    for r in cluster.replicas + cluster.decode:  # every block given back
        assert r.kv.used_blocks == 0


def test_two_requests_first_token_on_decode():
    """vLLM's NIXL way: the decode replica recomputes the last prompt token and samples the first:
    r0 arrives 2.5, tokens at 3.5, 4.5, 5.5; r1 arrives 5.0 while that step runs, tokens at 6.5, 7.5."""
    req, steps, itl, _ = run_disagg(workload(**TWO), first_token="decode")
    r0, r1 = req.loc[0], req.loc[1]
    assert (r0.transfer_end, r0.first_token, r0.completion) == (2.5, 3.5, 5.5)
    assert (r1.transfer_end, r1.first_token, r1.completion) == (5.0, 6.5, 7.5)
    dec = steps[steps.replica == 1]
    # the first decode-side step of each is one token over the prompt less one: a decode's shape
    assert list(dec.decode_tokens) == [1, 1, 1, 1, 1] and list(dec.num_seqs) == [1, 1, 1, 1, 1]


def test_two_requests_per_layer_overlap():
    """per_layer (2 layers): r0's transfer starts with its prefill step at 0 and ends at
    max(0 + 1, 1 + 1/2) = 1.5, arriving 2.0; r1's starts when the egress frees at 1.5 and ends at
    max(1.5 + 2.5, 2 + 2.5/2) = 4.0, arriving 4.5."""
    req, *_ = run_disagg(workload(**TWO), mode="per_layer")
    assert (req.loc[0].transfer_start, req.loc[0].transfer_end) == (0.0, 2.0)
    assert (req.loc[1].transfer_start, req.loc[1].transfer_end) == (1.5, 4.5)


def test_decode_blocks_wait_first_come_first_served():
    """A decode replica with room for one request's blocks: the second transfer waits for the first
    request to complete (blocks held from allocation to completion), then starts."""
    wl = workload([0.0, 0.0], [20, 20], [2, 2])
    req, steps, _, _ = run_disagg(wl, decode_blocks=2, block_size=16, bandwidth=1e9, latency=0.0)
    r0, r1 = req.loc[0], req.loc[1]
    # both prefill in one step [0,1]; r0 gets the two blocks, r1 waits until r0 completes
    assert r0.transfer_start == 1.0 and r1.transfer_start == r0.completion
    assert r1.first_token >= r0.completion


def test_a_stalled_decode_replica_is_found():
    """r0's growth preempts it while r1's 11 blocks are held; back in the queue, r0 (at its head)
    needs 10 blocks and 9 are free, and r1 waits behind it holding the rest: nothing can move."""
    wl = workload([0.0, 0.0], [129, 161], [17, 1])
    req, _, _, cluster = run_disagg(wl, decode_blocks=20, first_token="decode", bandwidth=500.0, latency=0.1,
                                    cost=ConstantCost(0.2, per_token=0.001))
    assert cluster.stalled() == [1]
    assert (req.status == "unfinished").all() and req.loc[0].preemptions == 1


def test_a_livelocked_decode_replica_stops_the_run():
    """(review) A chunked decode pool: a preempted request recomputes chunk by chunk and preempts
    itself one block short at its last chunk, again and again, while transferred requests behind it
    hold the rest. Without a horizon this ran forever; now the run stops and says why."""
    wl = workload([0.0, 0.44, 1.48, 1.87, 2.85], [238, 234, 152, 115, 159], [34, 12, 37, 19, 38])
    req, _, _, cluster = run_disagg(wl, decode=2, decode_blocks=36, bandwidth=500.0, latency=0.1,
                                    cost=ConstantCost(0.2, per_token=0.001),
                                    decode_policy={"name": "chunked_prefill", "max_num_batched_tokens": 64,
                                                   "max_num_seqs": 16})
    stalled = cluster.stalled()
    assert stalled and set(stalled) <= {1, 2}
    assert (req.status == "unfinished").any()
    assert req.preemptions.max() >= 1000 or cluster.livelocked == []


def test_a_stall_with_a_running_request_is_reported():
    """(review) The stuck request may be mid-recompute in `running`, not waiting: the run says so."""
    sc = {"name": "stall", "model": "llama-3-8b", "hardware": "h100-sxm", "seed": 3,
          "workload": {"num_requests": 200, "arrival": {"process": "poisson", "rate": 12},
                       "prompt_tokens": {"dist": "lognormal", "median": 1500, "p90": 4000, "max": 7000},
                       "output_tokens": {"dist": "lognormal", "median": 200, "p90": 600, "max": 1500}},
          "disaggregation": {"prefill": {"replicas": 2},
                             "decode": {"policy": {"name": "chunked_prefill", "gpu_memory_utilization": 0.23}}}}
    s = run_scenario(scenario_from_dict(sc)).summary
    if s["unfinished"]:
        assert any("stalled" in w for w in s["warnings"])
    else:  # (vLLM's order for transfers behind a preempted request avoided it)
        assert s["completed"] == 200


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 20), st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=25),
       st.sampled_from(["prefill", "decode"]), st.sampled_from(["per_request", "per_layer", "per_chunk"]),
       st.integers(1, 3), st.integers(1, 3), st.integers(3, 60),
       st.sampled_from([("after_prefill", 0), ("at_arrival", 0), ("at_arrival", 16), ("at_arrival", 100)]),
       st.booleans())
def test_properties(reqs, first_token, mode, n_pre, n_dec, decode_blocks, pairing, chunked):
    """Every completed request's KV crosses the link once, no request decodes before its transfer
    ends, and every request is accounted for across the pools; with pairing at_arrival, no prefill
    starts before its decode blocks are taken."""
    if mode == "per_chunk":  # (chunks go to blocks taken before the prefill)
        pairing = ("at_arrival", pairing[1])
    reqs = sorted(reqs)
    wl = workload([r[0] for r in reqs], [r[1] for r in reqs], [r[2] for r in reqs])
    req, steps, itl, cluster = run_disagg(wl, prefill=n_pre, decode=n_dec, mode=mode, first_token=first_token,
                                          decode_blocks=decode_blocks, bandwidth=500.0, latency=0.1,
                                          cost=ConstantCost(0.2, per_token=0.001), pairing=pairing[0],
                                          reserved=pairing[1], prefill_policy={
                                              "name": "chunked_prefill", "max_num_batched_tokens": 64,
                                              "max_num_seqs": 8} if chunked else None)
    assert len(req) == len(reqs)  # conservation: every arrival has a record
    done = req[req.status == "completed"]
    rejected = req[req.status == "rejected"]
    unfinished = req[req.status == "unfinished"]
    # no horizon: nothing is left unfinished unless a decode replica stalled (its KV held by transferred
    # requests queued behind a preempted one, as vLLM's FCFS queue would: DisaggCluster.stalled)
    assert len(done) + len(rejected) + len(unfinished) == len(req)
    assert bool(len(unfinished)) == bool(cluster.stalled())
    if len(unfinished):
        return
    # every request the decode pool can hold is served; those it cannot are refused at arrival
    cap = decode_blocks * 16
    assert all(rejected.prompt_tokens + rejected.output_tokens > cap)
    assert cluster.link.transfers == len(done)
    assert cluster.link.bytes == pytest.approx(float((done.prompt_tokens * 10.0).sum()))
    assert np.allclose(done.kv_transfer_bytes, done.prompt_tokens * 10.0)
    assert (done.transfer_end >= done.prefill_end).all()
    if pairing[0] == "at_arrival":  # (the bootstrap: decode blocks first, then the prefill)
        assert (done.decode_blocks <= done.prefill_admitted).all()
    else:
        assert (done.decode_blocks >= done.prefill_end).all()
        if mode == "per_request":  # (per_layer may start the transfer with the prefill's last step)
            assert (done.decode_blocks <= done.transfer_start).all()
    adm = done.decode_admitted  # (none for one output token sent with the KV: first_token prefill)
    assert ((adm >= done.transfer_end) | (adm.isna() & (done.output_tokens == 1) & (first_token == "prefill"))).all()
    assert (done.first_token >= done.transfer_end).all()
    if first_token == "decode":
        assert (done.first_token > done.transfer_end).all()
    multi = done[done.output_tokens > 1]
    assert (multi.last_token > multi.transfer_end).all()
    # gaps: one per token after the first, of completed requests
    assert len(itl) == int((done.output_tokens - 1).sum())
    for r in cluster.replicas + cluster.decode:
        assert r.kv.used_blocks == 0 and not r.seqs
    assert not cluster.in_transit and not any(cluster.alloc) and not any(cluster.bound) and not cluster.paired
    # decode-pool steps never hold a request before its KV arrived
    dec_steps = steps[steps.replica >= n_pre]
    if len(dec_steps) and len(done):
        assert dec_steps.start.min() >= done.transfer_end.min() - 1e-12


SCENARIO = {
    "name": "disagg", "model": "llama-3-8b", "hardware": "h100-sxm", "policy": {"name": "continuous"},
    "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 8},
                 "prompt_tokens": {"dist": "fixed", "value": 3000}, "output_tokens": {"dist": "fixed", "value": 40}},
    "disaggregation": {"prefill": {"replicas": 1, "policy": {"name": "chunked_prefill"}},
                       "decode": {"replicas": 2, "router": "least_outstanding"}},
}


def test_scenario_run_reports_pools_link_and_split():
    res = run_scenario(scenario_from_dict(SCENARIO))
    s = res.summary
    assert s["completed"] == 60 and s["engine"] == "python" and "KV transfer" in s["engine_reason"]
    d = s["disaggregation"]
    assert d["gpus"] == 3 and d["pools"]["decode"]["replicas"] == 2
    # Llama-3-8B KV: 2 x 32 layers x 8 heads x 128 x 2 bytes = 131072 B per token
    assert d["link"]["bytes"] == 60 * 3000 * 131072
    assert d["link"]["transfer_time"]["median_ms"] == pytest.approx(3000 * 131072 / 50e9 * 1e3 + 0.01)
    r = res.requests
    parts = (r.frontend_in_s if "frontend_in_s" in r else 0) + (r.admitted - r.arrival) + (r.prefill_end - r.admitted) \
        + (r.transfer_end - r.prefill_end) + (r.first_token - r.transfer_end)
    assert np.allclose(parts, r.ttft)
    assert set(r.replica) <= {1, 2} and set(r.prefill_replica) == {0}
    assert s["provenance"]["disaggregation"]["decode"]["replicas"] == 2
    assert set(s["provenance"]["policy"]) == {"prefill", "decode"}
    # deterministic
    again = run_scenario(scenario_from_dict(SCENARIO))
    assert json.dumps(again.summary, sort_keys=True) == json.dumps(s, sort_keys=True)


def test_an_engine_preset_is_resolved_for_each_pool_s_hardware():
    """(review) vllm-v1's limits depend on the GPU: a decode pool on A100 gets A100's, as a colocated
    A100 scenario with the preset does; a pool's own policy takes the preset's values it leaves unset."""
    base = {**SCENARIO, "engine_preset": "vllm-v1"}
    base.pop("policy")
    colo = scenario_from_dict({**base, "hardware": "a100-80gb", "disaggregation": None})
    sc = scenario_from_dict({**base, "disaggregation": {"decode": {"hardware": "a100-80gb"},
                                                        "prefill": {"policy": {"name": "chunked_prefill"}}}})
    prov = run_scenario(sc, keep_steps=False).summary["provenance"]["policy"]
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        assert prov["decode"][key] == colo.policy[key]
    h100 = scenario_from_dict({**base, "disaggregation": None})
    assert prov["prefill"]["gpu_memory_utilization"] == h100.policy["gpu_memory_utilization"]


def test_prefix_caching_on_the_prefill_pool_is_reported():
    sc = {**SCENARIO, "workload": {**SCENARIO["workload"], "shared_prefix": {"groups": 2, "tokens": 2048}},
          "disaggregation": {"prefill": {"policy": {"name": "chunked_prefill", "enable_prefix_caching": True}},
                             "decode": {"policy": {"name": "continuous"}}}}
    res = run_scenario(scenario_from_dict(sc))
    assert res.summary["prefix_cache_hit_rate"] > 0.5 and res.requests["cached_tokens"].sum() > 0


def test_compare_refuses_to_swap_a_disaggregated_scenario_s_policy():
    from batchsim.app.compare import with_policy

    with pytest.raises(InputError) as e:
        with_policy(scenario_from_dict(SCENARIO), "chunked_prefill")
    assert "plan --disagg" in str(e.value)


def test_heterogeneous_pools_price_each_on_its_hardware():
    sc = dict(SCENARIO, disaggregation={"prefill": {"hardware": "h100-sxm"},
                                        "decode": {"hardware": "a100-80gb", "tensor_parallel_size": 2}})
    s = run_scenario(scenario_from_dict(sc)).summary
    pools = s["disaggregation"]["pools"]
    assert pools["decode"]["hardware"] != pools["prefill"]["hardware"]
    # each pool's host overhead at its own TP (the datasheet profiles' per-step term grows with TP)
    assert pools["decode"]["overheads"]["host"]["per_step_us_at_tp"] >= pools["prefill"]["overheads"]["host"]["per_step_us_at_tp"]
    assert "h100-sxm (prefill) + " in s["provenance"]["hardware"]
    assert s["disaggregation"]["gpus"] == 3


@pytest.mark.parametrize("change, where", [
    ({"replicas": 2}, "replicas is for a colocated deployment"),
    ({"disaggregation": {"prefill": {"policy": {"name": "static", "max_batch_size": 64}}}},
     "disaggregation.prefill.policy.name"),
    ({"policy": {"name": "dynamic"}}, "disaggregation.decode.policy.name"),
    ({"disaggregation": {"decode": {"router": "fastest"}}}, "disaggregation.decode.router"),
    ({"disaggregation": {"decode": {"policy": {"name": "continuous", "block_size": 7}}}},
     "disaggregation.decode.policy.block_size"),
    ({"disaggregation": {"link": {"bandwidth_gbps": 1e-300}}}, "disaggregation.link.bandwidth_gbps"),
    ({"disaggregation": {"decode": {"policy": {"name": "static"}}}}, "disaggregation.decode.policy.name"),
    ({"disaggregation": {"decode": {"policy": {"name": "continuous", "max_num_seqs": 0}}}},
     "disaggregation.decode.policy.max_num_seqs"),
    ({"disaggregation": {"link": {"bandwidth_gbps": 0}}}, "disaggregation.link.bandwidth_gbps"),
    ({"engine": "core"}, "engine"),
])
def test_bad_disaggregation_input_names_the_field(change, where):
    sc = {**SCENARIO, **change}
    with pytest.raises(InputError) as e:
        run_scenario(scenario_from_dict(sc, "s.yaml"))
    assert where in str(e.value)


def test_cli_run_of_the_example(tmp_path, capsys, monkeypatch):
    from batchsim.app.examples import examples_dir

    out = tmp_path / "out"
    code, text, err = run_cli(capsys, monkeypatch, "run", str(examples_dir() / "disagg-1p1d.yaml"), "--out", str(out),
                              columns=200)
    assert code == 0, err
    assert "1P h100-sxm TP1 + 1D h100-sxm TP1" in text and "KV link busy" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["disaggregation"]["link"]["transfers"] == summary["completed"]
    assert math.isfinite(summary["median_ttft_ms"])


# -- plan over xPyD ----------------------------------------------------------------------------------
def test_parse_deployments():
    from batchsim.app.capacity.grid import parse_deployments

    assert parse_deployments("colocated, 1P1D,1p2d ,2:1,1P1D") == ("colocated", (1, 1), (1, 2), (2, 1))
    for bad in ("1P", "PD", "0P1D", "1x2", "2"):
        with pytest.raises(InputError) as e:
            parse_deployments(bad)
        assert "--disagg" in str(e.value)


def test_deployment_configs_price_their_pools():
    from batchsim.app.capacity.grid import build_configs
    from batchsim.app.capacity.planner import unit_price

    sc = scenario_from_dict({**SCENARIO, "disaggregation": {"decode": {"hardware": "a100-80gb",
                                                                       "policy": {"name": "continuous"}}}})
    configs = build_configs(sc, policies=("continuous", "chunked_prefill"),
                            deployments=("colocated", (1, 2), (2, 1)))
    labels = [c.label for c in configs]
    assert labels == ["h100-sxm tp1 continuous", "h100-sxm tp1 chunked_prefill", "h100-sxm tp1 1P2D",
                      "h100-sxm tp1 2P1D"]
    colo, _, d12, d21 = configs
    assert "disaggregation" not in colo.scenario and colo.gpus == 1 and colo.deployment == "colocated"
    assert d12.pools == (("h100-sxm", 1), ("a100-80gb", 2)) and d12.gpus == 3 and d12.deployment == "1P2D"
    assert d21.scenario["disaggregation"]["prefill"]["replicas"] == 2 and "replicas" not in d21.scenario
    assert unit_price(d12, {"h100-sxm": 3.0, "a100-80gb": 1.5}) == pytest.approx((3.0 + 2 * 1.5) / 3)
    assert d12.policy == "continuous/continuous"
    # a pool's hardware as a knob: the deployments get each value, the colocated configurations none
    configs = build_configs(sc, deployments=("colocated", (1, 1)),
                            knobs=(("disaggregation.decode.hardware", ("h100-sxm", "a100-80gb")),))
    assert [c.label for c in configs] == ["h100-sxm tp1 continuous",
                                          "h100-sxm tp1 1P1D disaggregation.decode.hardware=h100-sxm",
                                          "h100-sxm tp1 1P1D disaggregation.decode.hardware=a100-80gb"]
    assert configs[2].pools == (("h100-sxm", 1), ("a100-80gb", 1))


def test_plan_compares_colocated_and_disaggregated(tmp_path):
    from batchsim.app.capacity.planner import PlanSpec, plan

    sc = scenario_from_dict({**SCENARIO, "workload": {**SCENARIO["workload"], "num_requests": 120}})
    spec = PlanSpec(slos={"p90_ttft_ms": 800.0, "p90_tpot_ms": 30.0}, deployments=("colocated", (1, 1), (2, 1)),
                    target_rate=20.0, seeds=1)
    res = plan(sc, spec, tmp_path / "plan", executor="serial")
    f = res.frame.set_index("config")
    assert list(f["deployment"].sort_index()) == ["1P1D", "2P1D", "colocated"]
    # (SCENARIO's decode pool has 2 replicas: 1P1D overrides it)
    assert f.loc["h100-sxm tp1 1P1D", "gpus_per_unit"] == 2
    assert f.loc["h100-sxm tp1 2P1D", "gpus_per_unit"] == 3 and f.loc["h100-sxm tp1 continuous", "gpus_per_unit"] == 1
    for _, r in f.iterrows():
        if r["capacity_rps"] > 0:
            assert r["capacity_rps_per_gpu"] == pytest.approx(r["capacity_rps"] / r["gpus_per_unit"])
            assert r["gpus"] == r["replicas"] * r["gpus_per_unit"]
            assert r["usd_per_hour"] == pytest.approx(r["gpus"] * r["usd_per_gpu_hour"])


def test_bench_compare_prints_each_deployment_and_draws(tmp_path, capsys):
    from bench.disagg_compare import main
    from batchsim.app.examples import examples_dir

    png = tmp_path / "c.png"
    assert main(["--scenario", str(examples_dir() / "disagg-1p1d.yaml"), "--rates", "1,3", "--png", str(png),
                 "--tpot-slo", "12,15"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| 1P1D"] * 2 + ["| colocated continuous"] * 2 + \
        ["| colocated chunked_prefill"] * 2
    assert png.stat().st_size > 10_000


def test_the_distserve_example_runs_as_a_2p1d_deployment():
    from batchsim.app.config import load_scenario
    from batchsim.app.examples import examples_dir

    sc = load_scenario(examples_dir() / "distserve-fig1.yaml", ["workload.num_requests=200"])
    s = run_scenario(sc, keep_steps=False).summary
    d = s["disaggregation"]
    assert d["gpus"] == 3 and d["pools"]["prefill"]["replicas"] == 2 and s["completed"] == 200
    # 512 tokens x 819,200 B (Llama-2-13B fp16: 2 x 40 layers x 5120) over 300 GB/s + 10 us
    assert d["link"]["transfer_time"]["median_ms"] == pytest.approx(512 * 819200 / 300e9 * 1e3 + 0.01)


# -- the cache-aware router (SGLang's model gateway) ---------------------------------------------------
def _prefix_scenario(router: str, **extra) -> dict:
    return {"name": "prefix", "model": "llama-3-8b", "hardware": "h100-sxm", "replicas": 4, "router": router,
            "policy": {"name": "chunked_prefill", "enable_prefix_caching": True},
            "workload": {"num_requests": 400, "arrival": {"process": "poisson", "rate": 8},
                         "prompt_tokens": {"dist": "fixed", "value": 3000},
                         "output_tokens": {"dist": "fixed", "value": 20},
                         "shared_prefix": {"groups": 4, "tokens": 2048}}, **extra}


def test_cache_aware_router_follows_the_cached_prefix():
    """32 templates of 4,096 tokens, each replica's KV holding about 15 of them: round robin spreads
    every template over every replica and evicts; the cache-aware router keeps each on a replica."""
    def run(router):
        d = _prefix_scenario(router)
        d["workload"]["shared_prefix"] = {"groups": 32, "tokens": 4096}
        d["workload"]["prompt_tokens"] = {"dist": "fixed", "value": 4600}
        d["policy"]["gpu_memory_utilization"] = 0.3
        return run_scenario(scenario_from_dict(d)).summary

    rr, ca = run("round_robin"), run("cache_aware")
    assert ca["prefix_cache_hit_rate"] > rr["prefix_cache_hit_rate"] + 0.3
    assert ca["median_ttft_ms"] < rr["median_ttft_ms"]
    assert ca["engine"] == "python"  # (the core has no prefix cache, nor this router)


def test_cache_aware_router_balances_when_load_is_skewed():
    from batchsim.sim.kv import PagedKVCache
    from batchsim.sim.prefix import PrefixKVCache
    from batchsim.sim.router import make_router
    from batchsim.sim.state import Seq

    class R:
        def __init__(self, i, load, kv):
            self.index, self.outstanding, self.kv, self.waiting = i, load, kv, []

    hot, cold = PrefixKVCache(100, 16, 512), PrefixKVCache(100, 16, 512)
    hot._refs.update({11: 1, 12: 1})  # replica 0 holds the prompt's first two units
    seq = Seq(0, 0.0, 2000, 10, (11, 12, 13))
    route = make_router("cache_aware", np.random.default_rng(0))
    assert route([R(0, 10, hot), R(1, 0, cold)], seq) == 0  # balanced (10 - 0 <= 32): the prefix wins
    assert route([R(0, 40, hot), R(1, 5, cold)], seq) == 1  # 35 > 32 and 40 > 1.1 x 5: the least loaded
    assert route([R(0, 3, PagedKVCache(10, 16)), R(1, 1, PagedKVCache(10, 16))], seq) == 1  # no prefix cache


def test_sweep_and_compare_run_a_disaggregated_scenario_as_its_deployment(tmp_path):
    from batchsim.app.compare import compare
    from batchsim.app.sweep import sweep

    sc = scenario_from_dict({**SCENARIO, "workload": {**SCENARIO["workload"], "num_requests": 40}})
    res = sweep(sc, [4.0, 8.0], seeds=1, executor="serial")
    assert list(res.policies) == ["1P2D"]
    cmp = compare(sc, seeds=1, executor="serial")
    assert [r.policy for r in cmp.runs] == ["1P2D"]
    assert cmp.runs[0].summaries[0]["disaggregation"]["gpus"] == 3


def test_plan_rows_of_a_disaggregated_file_reproduce_colocated_and_split(tmp_path):
    """(found late) --disagg colocated with --policies on a file that has a disaggregation section:
    the reproduce command of a colocated row unsets it (--set disaggregation=null) and swaps the policy."""
    import shlex

    import yaml

    from batchsim.app.capacity.planner import PlanSpec, plan
    from batchsim.app.config import load_scenario

    data = {**SCENARIO, "workload": {**SCENARIO["workload"], "num_requests": 120}}
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = PlanSpec(slos={"p90_ttft_ms": 800.0}, policies=("continuous", "chunked_prefill"),
                    deployments=("colocated", (1, 1)), seeds=1)
    res = plan(scenario_from_dict(data), spec, tmp_path / "p", executor="serial", source=(str(path), ()))
    for _, r in res.frame.iterrows():
        args = shlex.split(r["reproduce"])
        policy = args[args.index("--policy") + 1] if "--policy" in args else None
        sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        sc = load_scenario(args[2], sets)
        if policy:
            from batchsim.app.compare import with_policy
            sc = with_policy(sc, policy)
        s = run_scenario(sc, keep_steps=False).summary
        assert s["p90_ttft_ms"] == pytest.approx(r["p90_ttft_ms"]), r["config"]
        assert ("disaggregation=null" in r["reproduce"]) == (r["deployment"] == "colocated")


@pytest.mark.parametrize("horizon", [20.0, 0.15])  # (0.15 s: none has left the frontend)
def test_requests_still_in_the_frontend_at_the_horizon_are_unfinished_with_no_transfer(horizon):
    # (a frontend slower than the arrivals: at horizon_s some requests never reached the prefill pool)
    data = __import__("yaml").safe_load(open("examples/disagg-1p1d.yaml"))
    data.update(horizon_s=horizon, overheads={"frontend": {"per_request_us": 200000}})
    result = run_scenario(scenario_from_dict(data))
    req = result.requests
    waiting = req[req["prefill_replica"] == -1]
    assert len(waiting) > 0 and set(waiting["status"]) == {"unfinished"}
    assert waiting[["prefill_end", "transfer_end", "kv_transfer_bytes", "frontend_in_s"]].isna().all().all()
    assert req["rid"].is_monotonic_increasing and req["prefill_replica"].dtype == np.int64
    assert result.summary["unfinished"] >= 1 or horizon < 1


def test_plan_rows_of_a_colocated_file_with_replicas_and_router_reproduce_split(tmp_path):
    """A colocated file that names replicas and router: its xPyD rows' reproduce commands set them
    back to their defaults (a default written out is allowed beside a disaggregation section)."""
    import shlex

    import yaml

    from batchsim.app.capacity.planner import PlanSpec, plan
    from batchsim.app.config import load_scenario

    data = {k: v for k, v in SCENARIO.items() if k != "disaggregation"}
    data.update(replicas=2, router="least_outstanding", workload={**SCENARIO["workload"], "num_requests": 160})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = PlanSpec(slos={"p90_ttft_ms": 800.0}, deployments=("colocated", (1, 1)), seeds=1)
    res = plan(scenario_from_dict(data), spec, tmp_path / "p", executor="serial", source=(str(path), ()))
    assert len(res.frame) == 2
    for _, r in res.frame.iterrows():
        assert r["reproduce"], r["config"]
        args = shlex.split(r["reproduce"])
        sc = load_scenario(args[2], [args[i + 1] for i, a in enumerate(args) if a == "--set"])
        assert (sc.disaggregation is not None) == (r["deployment"] != "colocated")
        assert run_scenario(sc, keep_steps=False).summary["p90_ttft_ms"] == pytest.approx(r["p90_ttft_ms"]), r["config"]
    with pytest.raises(InputError, match="replicas is for a colocated deployment"):
        scenario_from_dict({**SCENARIO, "replicas": 2})
    assert scenario_from_dict({**SCENARIO, "replicas": 1, "router": "round_robin"}).disaggregation is not None


def test_a_prompt_the_prefill_pool_cannot_hold_is_refused_in_its_own_words():
    """A prompt whose KV fits the decode pool but not a smaller prefill pool: the prefill pool ran
    it as a one-token request, and the reason says so (not 'prompt+output P+1' as if the user had
    asked for one token)."""
    wl = workload(arrivals=[0.0, 0.1], prompts=[100, 10], outputs=[5, 3])
    req, _, _, _ = run_disagg(wl, prefill_blocks=4, decode_blocks=100, block_size=16)
    assert req.loc[0, "status"] == "rejected"
    assert req.loc[0, "reason"] == "prefill pool: prompt+first token 101 tokens > KV capacity 64"
    assert req.loc[1, "status"] == "completed"


def test_pairing_at_arrival_gates_the_prefill_on_decode_blocks():
    """SGLang's bootstrap, worked by hand (1 s steps, 10 B/token over 200 B/s, 0.5 s latency; a decode
    replica of two 16-token blocks, no reserve). Both requests (20-token prompts, 2 outputs) arrive at 0.
    r0 is paired and takes both decode blocks (20 + 1 tokens) at 0: prefill [0,1], transfer 200 B
    [1,2] + 0.5 -> its first token at 2.5, decode step [2.5,3.5]: done, its blocks free at 3.5. r1 only
    then gets its blocks and enters the prefill queue: prefill [3.5,4.5], transfer [4.5,5.5] -> 6.0,
    decode [6.0,7.0]. After the prefill (vLLM's way) r1 would prefill with r0 in [0,1] and wait for
    the blocks after it instead: transfer [3.5,4.5] -> 5.0, done 6.0."""
    wl = workload([0.0, 0.0], [20, 20], [2, 2])
    kw = dict(decode_blocks=2, block_size=16, bandwidth=200.0, latency=0.5)
    req, steps, _, cluster = run_disagg(wl, pairing="at_arrival", **kw)
    r0, r1 = req.loc[0], req.loc[1]
    assert (r0.decode_blocks, r0.prefill_admitted, r0.prefill_end, r0.transfer_start, r0.transfer_end) == (0, 0, 1, 1, 2.5)
    assert (r0.first_token, r0.completion) == (2.5, 3.5)
    assert (r1.decode_blocks, r1.prefill_admitted, r1.prefill_end, r1.transfer_start, r1.transfer_end) == (3.5, 3.5, 4.5, 4.5, 6.0)
    assert (r1.first_token, r1.completion) == (6.0, 7.0)
    pre = steps[steps.replica == 0]
    assert list(zip(pre.start, pre.end)) == [(0, 1), (3.5, 4.5)] and list(pre.num_seqs) == [1, 1]
    for r in cluster.replicas + cluster.decode:
        assert r.kv.used_blocks == 0
    after, *_ = run_disagg(wl, **kw)
    assert list(after.decode_blocks) == [1.0, 3.5] and list(after.prefill_admitted) == [0, 0]
    assert list(after.completion) == [3.5, 6.0]


def test_pairing_at_arrival_keeps_the_reserve_free():
    """The decode replica keeps ``reserved_tokens`` free for each request it runs, queues or has
    pre-allocated (SGLang's _allocatable_tokens): 4 blocks of 16 (64 tokens), reserve 16. r0 (20-token
    prompt: 2 blocks) needs 32 + 16 <= 64 and is paired at 0, leaving 16; r1 needs 48 and waits. When
    r0 arrives (2.5) it holds 2 blocks and reserves 16: 32 - 16 < 48, so r1 waits for r0's completion
    (3.5). With no reserve both are paired at 0 and prefill together."""
    wl = workload([0.0, 0.0], [20, 20], [2, 2])
    kw = dict(decode_blocks=4, block_size=16, bandwidth=200.0, latency=0.5, pairing="at_arrival")
    req, *_ = run_disagg(wl, reserved=16, **kw)
    assert list(req.decode_blocks) == [0.0, 3.5] and list(req.prefill_admitted) == [0.0, 3.5]
    free, *_ = run_disagg(wl, reserved=0, **kw)
    assert list(free.decode_blocks) == [0.0, 0.0] and list(free.prefill_admitted) == [0.0, 0.0]


def test_pairing_at_arrival_stall_is_reported_not_hung():
    """A prompt whose KV and reserve exceed the decode replica (but whose prompt and output fit: not
    refused at arrival) waits for blocks that never come: the run ends and says so."""
    wl = workload([0.0], [20], [2])
    req, _, _, cluster = run_disagg(wl, decode_blocks=2, block_size=16, pairing="at_arrival", reserved=16)
    assert req.loc[0].status == "unfinished" and cluster.stalled() == [1]


def test_pairing_scenario_fields_and_errors():
    base = {"model": "llama-3-8b", "hardware": "h100-sxm", "workload": {"num_requests": 20, "arrival": {
        "process": "poisson", "rate": 2}, "prompt_tokens": {"dist": "fixed", "value": 300},
        "output_tokens": {"dist": "fixed", "value": 20}}, "policy": {"name": "continuous"}}
    sc = scenario_from_dict({**base, "disaggregation": {"pairing": "at_arrival"}}, "t")
    assert sc.disaggregation.reserved_decode_tokens == 512
    r = run_scenario(sc)
    d = r.summary["disaggregation"]
    assert d["pairing"] == "at_arrival" and d["reserved_decode_tokens"] == 512
    assert list(d["ttft_split"])[:2] == ["decode_blocks", "queue"]
    done = r.requests[r.requests.status == "completed"]
    assert (done.decode_blocks <= done.admitted).all()
    with pytest.raises(InputError, match="reserved_decode_tokens"):
        scenario_from_dict({**base, "disaggregation": {"reserved_decode_tokens": 64}}, "t")
    with pytest.raises(InputError, match="pairing"):
        scenario_from_dict({**base, "disaggregation": {"pairing": "later"}}, "t")


def test_per_chunk_sends_each_chunk_as_its_step_ends():
    """SGLang's send_kv_chunk, worked by hand: a 20-token prompt prefilled in chunks of 8, 8 and 4 (1 s
    steps, a token budget of 8), blocks of 4 tokens, 10 B/token over 40 B/s, 0.5 s latency. The first
    chunk's 80 B leave at 1 ([1,3]), the second's when the link frees ([3,5]), the last 4 tokens when the
    prefill ends at 3, behind them ([5,6]): the KV is in at 6.5, its first token too. per_request sends
    200 B from 3: [3,8] -> 8.5; per_layer (2 layers) from the last step's start 2: max(2+5, 3+2.5) = 7 -> 7.5."""
    wl = workload([0.0], [20], [2])
    kw = dict(block_size=4, bandwidth=40.0, latency=0.5, pairing="at_arrival",
              prefill_policy={"name": "chunked_prefill", "max_num_batched_tokens": 8, "max_num_seqs": 4})
    req, *_, cluster = run_disagg(wl, mode="per_chunk", **kw)
    r = req.loc[0]
    assert (r.prefill_end, r.transfer_start, r.transfer_end, r.first_token) == (3.0, 1.0, 6.5, 6.5)
    assert r.kv_transfer_bytes == 200.0 and cluster.link.bytes == 200.0 and cluster.link.transfers == 1
    assert cluster.link.out_busy == [5.0]
    assert req.loc[0].transfer_end == 6.5
    assert run_disagg(wl, mode="per_request", **kw)[0].loc[0].transfer_end == 8.5
    assert run_disagg(wl, mode="per_layer", **kw)[0].loc[0].transfer_end == 7.5
    with pytest.raises(ValueError, match="pairing at_arrival"):
        run_disagg(wl, mode="per_chunk", **{**kw, "pairing": "after_prefill"})


def test_pairing_at_arrival_counts_the_bootstrap_queue_for_routing_and_queue_limits():
    """A request waiting for its decode blocks waits in its prefill replica's bootstrap queue: a
    load-aware prefill router counts it there (six requests at 0 over two prefill replicas behind
    least_outstanding alternate, as with after_prefill, instead of piling onto the first), and so
    does max_queue_len."""
    wl = workload([0.0] * 6, [20] * 6, [3] * 6)
    req, *_ = run_disagg(wl, prefill=2, decode_blocks=4, pairing="at_arrival", prefill_router="least_outstanding")
    assert list(req.prefill_replica) == [0, 1, 0, 1, 0, 1]
    # one prefill replica, a queue of 2, decode room for one: r0 takes the blocks and waits for its
    # prefill, r1 waits in the bootstrap queue, r2 finds the two and is refused, as after_prefill's queue
    for pairing in ("at_arrival", "after_prefill"):
        req, *_ = run_disagg(wl, decode_blocks=2, pairing=pairing, max_queue_len=2)
        assert list(req.status) == ["completed"] * 2 + ["rejected"] * 4
        assert set(req.reason[req.status == "rejected"]) == {"queue full (2 waiting)"}


@pytest.mark.parametrize("pairing", ["after_prefill", "at_arrival"])
def test_a_decode_pool_with_a_watermark_admits_what_arrived_by_transfer(pairing):
    """A transferred request holds its KV on the decode replica before it is admitted; the admission
    watermark guards blocks an admission allocates, so it does not hold back requests whose KV is there
    (three transfers leave 1 of 10 blocks free, under a 0.3 watermark's 3; they used to wait forever)."""
    wl = workload([0.0, 0.0, 0.0, 0.0], [8, 8, 8, 8], [4, 4, 4, 4])
    req, *_ = run_disagg(wl, decode_blocks=10, block_size=4, pairing=pairing,
                         decode_policy={"name": "continuous", "watermark": 0.3})
    assert (req["status"] == "completed").all()
