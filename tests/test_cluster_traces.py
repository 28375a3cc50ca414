"""Clusters, routing, real-trace replays and prefix caching on the Mooncake trace."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, run_scenario, simulate
from batchsim.sim.types import Workload

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
AZURE = TRACES / "azure2023_AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake_fast25_synthetic_trace.jsonl"
POLICIES = ["static", "dynamic", "continuous", "chunked_prefill"]


def _scenario(**kw):
    base = {"model": "llama-3-8b", "hardware": "h100-sxm",
            "workload": {"num_requests": 400, "arrival": {"process": "poisson", "rate": 20.0},
                         "prompt_tokens": {"dist": "fixed", "value": 500},
                         "output_tokens": {"dist": "fixed", "value": 100}}}
    base.update(kw)
    return scenario_from_dict(base)


def test_round_robin_spreads_evenly_on_identical_replicas():
    r = run_scenario(_scenario(replicas=4, router="round_robin", policy={"name": "continuous"}))
    assert r.summary["per_replica_completed"] == [100, 100, 100, 100]
    assert r.summary["load_imbalance"] == 1.0
    assert r.summary["completed"] == 400


def test_least_outstanding_beats_round_robin_on_skewed_lengths():
    # Every 4th request is huge: round robin sends them all to replica 0.
    n = 400
    rng = np.random.default_rng(7)
    arrival = np.cumsum(rng.exponential(1 / 16.0, n))
    prompt = np.where(np.arange(n) % 4 == 0, 3000, 200).astype(np.int64)
    output = np.where(np.arange(n) % 4 == 0, 600, 50).astype(np.int64)
    wl = Workload(arrival=arrival, prompt_tokens=prompt, output_tokens=output)
    p99 = {}
    for router in ("round_robin", "least_outstanding"):
        sc = _scenario(replicas=4, router=router, policy={"name": "continuous", "max_num_seqs": 16})
        res = simulate(sc, build_parts(sc, workload=wl))
        assert res.summary["completed"] == n
        p99[router] = res.summary["p99_ttft_ms"]
    assert p99["least_outstanding"] < p99["round_robin"], p99


@pytest.mark.parametrize("router", ["power_of_two", "least_kv"])
def test_other_routers_run_and_account(router):
    r = run_scenario(_scenario(replicas=3, router=router, policy={"name": "chunked_prefill"}))
    assert r.summary["completed"] == 400
    assert sum(r.summary["per_replica_completed"]) == 400


def test_router_is_deterministic():
    a = run_scenario(_scenario(replicas=3, router="power_of_two"))
    b = run_scenario(_scenario(replicas=3, router="power_of_two"))
    assert json.dumps(a.summary) == json.dumps(b.summary)


@pytest.mark.skipif(not AZURE.exists(), reason="../shared/traces is absent")
@pytest.mark.parametrize("policy", POLICIES)
def test_azure_code_trace_replays_through_each_policy(policy):
    # The first 10 minutes of the Azure code trace on two H100s, llama-3.1-8b (long context).
    sc = scenario_from_dict({
        "model": "llama-3.1-8b", "hardware": "h100-sxm", "replicas": 2, "router": "least_outstanding",
        "policy": {"name": policy},
        "workload": {"trace": {"path": str(AZURE), "format": "azure", "end_s": 600}},
    })
    r = run_scenario(sc)
    s = r.summary
    assert s["num_requests"] > 1000
    assert s["completed"] + s["rejected"] + s["unfinished"] == s["num_requests"]
    assert s["unfinished"] == 0
    assert s["completed"] >= 0.99 * s["num_requests"]


def _direct_reuse(wl: Workload, unit: int, capacity_units: int) -> float:
    """Hit rate of an LRU cache of ``capacity_units`` prefix units, straight from
    hash_ids in arrival order, with the lookup rule of batchsim.sim.prefix (full units,
    at least one prompt token recomputed)."""
    cache: OrderedDict[int, None] = OrderedDict()
    looks = hits = 0
    for hashes, p in zip(wl.prefix_hashes, wl.prompt_tokens.tolist()):
        limit = min(len(hashes), (p - 1) // unit)
        n = 0
        while n < limit and hashes[n] in cache:
            n += 1
        looks += limit
        hits += n
        for h in hashes[: min(len(hashes), p // unit)]:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > capacity_units:
            cache.popitem(last=False)
    return hits / looks


@pytest.mark.skipif(not MOONCAKE.exists(), reason="../shared/traces is absent")
def test_mooncake_prefix_cache_hit_rate_matches_hash_reuse_and_cuts_ttft():
    # 800 Mooncake requests (15k-token prompts on average) on llama-3.1-8b, 4 x H200 (TP 4).
    def sc(caching: bool):
        return scenario_from_dict({
            "model": "llama-3.1-8b", "hardware": "h200", "tensor_parallel_size": 4,
            "policy": {"name": "chunked_prefill", "max_num_batched_tokens": 2048,
                       "enable_prefix_caching": caching},
            "workload": {"trace": {"path": str(MOONCAKE), "format": "mooncake", "max_requests": 800}},
        })
    parts = build_parts(sc(True))
    on = simulate(sc(True), parts)
    off = simulate(sc(False), parts)
    units = on.meta["kv_blocks"] * on.meta["block_size"] // 512
    lru = _direct_reuse(parts.workload, 512, units)
    infinite = _direct_reuse(parts.workload, 512, 10**9)
    measured = on.summary["prefix_cache_hit_rate"]
    # The cache holds ~3.9k of the trace's units: eviction keeps it below the infinite-cache reuse.
    assert measured == pytest.approx(lru, abs=0.02), (measured, lru)
    assert 0.05 < measured <= infinite + 0.005
    assert on.summary["completed"] == off.summary["completed"] == 799  # one prompt > 128k context
    assert on.summary["median_ttft_ms"] < 0.95 * off.summary["median_ttft_ms"]
    assert on.summary["total_input_tokens"] == off.summary["total_input_tokens"]
    assert on.requests["cached_tokens"].sum() > 0.05 * on.requests["prompt_tokens"].sum()
