"""The known pathologies of each policy, reproduced on the real cost model.

Llama-3-8B on an H100 SXM, a long-tailed (lognormal) mix of lengths.
"""

from __future__ import annotations

import numpy as np
import pytest

from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, simulate
from batchsim.sim.types import StepShape, Workload

BASE = {
    "model": "llama-3-8b",
    "hardware": "h100-sxm",
    "workload": {
        "num_requests": 600,
        "arrival": {"process": "poisson", "rate": 200.0},  # far past saturation
        "prompt_tokens": {"dist": "lognormal", "median": 300, "p90": 1500, "max": 4000},
        "output_tokens": {"dist": "lognormal", "median": 60, "p90": 400, "max": 1000},
    },
    "seed": 3,
}


def _run(policy: dict, base: dict = BASE, workload: Workload | None = None):
    sc = scenario_from_dict(dict(base, policy=policy))
    return simulate(sc, build_parts(sc, workload=workload))


@pytest.fixture(scope="module")
def saturated():
    return {
        "static": _run({"name": "static", "max_batch_size": 16}),
        "continuous": _run({"name": "continuous"}),
    }


def test_continuous_triples_static_throughput_at_saturation(saturated):
    s, c = saturated["static"].summary, saturated["continuous"].summary
    assert s["completed"] == c["completed"] == 600
    assert c["output_throughput"] >= 3 * s["output_throughput"], (c["output_throughput"], s["output_throughput"])


def test_static_short_requests_wait_for_long_ones(saturated):
    def p99_short(result):
        r = result.requests
        short = r[r["output_tokens"] <= r["output_tokens"].quantile(0.25)]
        return float(np.percentile(short["e2el"], 99))

    assert p99_short(saturated["static"]) > 3 * p99_short(saturated["continuous"])
    assert saturated["static"].summary["token_efficiency"] < 0.7
    assert saturated["continuous"].summary["token_efficiency"] == 1.0


def _stall_workload(long_prompt: int) -> Workload:
    # 8 chatty requests at t=0 decoding for a long time; one long prompt at t=1.
    arrival = np.array([0.0] * 8 + [1.0])
    prompt = np.array([64] * 8 + [long_prompt], dtype=np.int64)
    output = np.array([400] * 8 + [2], dtype=np.int64)
    return Workload(arrival=arrival, prompt_tokens=prompt, output_tokens=output)


def test_prefill_stall_separate_vs_chunked():
    long_prompt = 6000
    wl = _stall_workload(long_prompt)
    sep = _run({"name": "continuous", "prefill_mode": "separate"}, workload=wl)
    chk = _run({"name": "chunked_prefill", "max_num_batched_tokens": 512}, workload=wl)
    cost = build_parts(scenario_from_dict(dict(BASE, policy={"name": "continuous"})), workload=wl).cost
    decode = cost.price(StepShape.of([(1, 500)] * 8)).seconds
    prefill = cost.price(StepShape.of([(long_prompt, 0)])).seconds
    chunk = cost.price(StepShape.of([(1, 500)] * 8 + [(512 - 8, 3000)])).seconds

    def running_max_itl(result):
        r = result.requests
        return float(r[r["prompt_tokens"] == 64]["max_itl"].max())

    sep_itl, chk_itl = running_max_itl(sep), running_max_itl(chk)
    # separate: the decodes wait for the whole prefill step (plus their own step)
    assert sep_itl == pytest.approx(prefill + decode, rel=0.15), (sep_itl, prefill, decode)
    # chunked: bounded near one chunked step's time
    assert chk_itl <= 1.5 * chunk, (chk_itl, chunk)
    assert chk_itl < sep_itl / 3
