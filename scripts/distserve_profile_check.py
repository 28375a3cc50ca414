"""batchsim's step prices against the A100 step times DistServe's repository ships for a 13B model.

DistServe (Zhong et al., OSDI 2024) simulates its placements with step-time models fitted to its
measurements on A100-80GB SXM GPUs: ``simdistserve/estimators/profile_data/profiler-a100-80g.distserve.json``
(its own engine) and ``profiler-a100-80g.vllm.json`` (vLLM), in https://github.com/LLMServe/DistServe
at commit 82831f1 (read by ``simdistserve/estimators/time_estimator.py``, same commit). For
``facebook/opt-13b`` at TP 1 (milliseconds; ``n`` = the batch's prompt tokens, ``s2`` = the sum of
each prompt's tokens squared, ``T`` = the batch's context tokens, ``b`` = the batch's requests):

- prefill: ``a + b1 * n + c * s2``
- decode: ``a + b1 * T + c * b``, one set of coefficients below ``decoding_large_small_bs_threshold``
  requests and another from it.

:data:`FITS` copies the coefficients. batchsim prices the same steps for ``llama-2-13b`` (the
stand-in of examples/distserve-fig1.yaml: OPT-13B's layers, width, heads and KV per token) on the
shipped ``a100-80gb`` datasheet profile, fp16, TP 1, host terms included: a prompt of 512 tokens
alone, and a decode step of ``b`` requests at 544 tokens of context (Figure 1's 512-token prompts
halfway through their 64 output tokens). The tolerance, set before the first run (batchsim's
68.6 ms 512-token prefill was already in docs/disaggregation.md): ±20% a point, against each fit.

It then bounds Figure 1's prefill-only capacity from the fitted prefill time alone: a prefill-only
instance serving one 512-token prompt at a time is an M/D/1 queue with service time D; the largest
Poisson rate whose P90 TTFT is at most 0.4 s is found by bisection on a Lindley recursion over
200,000 arrivals (seed 0). Batching prompts can only serve more.

    python scripts/distserve_profile_check.py
"""

from __future__ import annotations

import numpy as np

from batchsim.calibrate.costmodel import RooflineCostModel
from batchsim.calibrate.hardware import load_hardware
from batchsim.calibrate.models import load_model
from batchsim.sim.types import StepShape

TOLERANCE = 0.20
PROMPT, CONTEXT = 512, 544
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)

# engine -> (prefill (a, b1, c), decode below threshold (a, b1, c), decode from it (a, b1, c), threshold)
FITS = {
    "distserve": ((18.10254647486372, 0.1019122572698738, 7.122264314252114e-06),
                  (19.934702624895458, 0.0006269356524350583, 0.03850697740828398),
                  (7.1661889468253595, 0.0005798000403396046, 0.15831096191764046), 95),
    "vllm": ((22.052204789310185, 0.14050923870128956, 8.076584822611088e-06),
             (23.475041008414784, 0.000592934466077393, 0.060726861260369455),
             (20.206356173691958, 0.0004907727036234946, 0.1200031385587413), 95),
}


def fitted_prefill_ms(engine: str, prompts: list[int]) -> float:
    a, b1, c = FITS[engine][0]
    return a + b1 * sum(prompts) + c * sum(p * p for p in prompts)


def fitted_decode_ms(engine: str, batch: int, context: int) -> float:
    _, small, large, threshold = FITS[engine]
    a, b1, c = small if batch < threshold else large
    return a + b1 * batch * context + c * batch


def batchsim_ms(shape: StepShape) -> float:
    cm = RooflineCostModel(load_model("llama-2-13b"), load_hardware("a100-80gb"), dtype="fp16")
    return cm.price(shape).seconds * 1e3


def step_rows() -> list[dict]:
    rows = []
    sim = batchsim_ms(StepShape.of([(PROMPT, 0)]))
    for engine in FITS:
        rows.append({"step": f"prefill 1 x {PROMPT}", "fit": engine, "fitted_ms": fitted_prefill_ms(engine, [PROMPT]),
                     "batchsim_ms": sim})
    for b in BATCHES:
        sim = batchsim_ms(StepShape.of([(1, CONTEXT)] * b))
        for engine in FITS:
            rows.append({"step": f"decode {b} x ctx {CONTEXT}", "fit": engine,
                         "fitted_ms": fitted_decode_ms(engine, b, CONTEXT), "batchsim_ms": sim})
    for r in rows:
        r["error"] = r["batchsim_ms"] / r["fitted_ms"] - 1
        r["within"] = abs(r["error"]) <= TOLERANCE
    return rows


def md1_p90_rate(service_s: float, p90_s: float = 0.4, n: int = 200_000, seed: int = 0) -> float:
    """The largest Poisson rate (req/s, to 0.01) at which an M/D/1 queue's P90 sojourn time is at most ``p90_s``."""
    gaps = np.random.default_rng(seed).exponential(1.0, n)  # (scaled by 1/rate: common random numbers)

    def p90(rate: float) -> float:
        wait, out = 0.0, np.empty(n)
        g = gaps / rate
        for i in range(n):  # Lindley: W_{i+1} = max(0, W_i + D - gap_{i+1})
            out[i] = wait + service_s
            wait = max(0.0, wait + service_s - g[i])
        return float(np.quantile(out[n // 10:], 0.9))  # (the first tenth is warm-up)

    lo, hi = 0.0, 1.0 / service_s
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p90(mid) <= p90_s else (lo, mid)
    return round(lo, 2)


def decode_only_rate(step_ms, tpot_ms: float = 40.0, outputs: int = 64) -> tuple[int, float]:
    """Little's law for a decode-only instance: at a steady batch of ``b`` the step takes ``step_ms(b)``,
    each request stays ``outputs - 1`` steps, so it serves ``b / ((outputs - 1) x step)`` req/s; the
    largest ``b`` whose step is at most ``tpot_ms`` bounds its capacity. Returns (b, req/s)."""
    b = 1
    while step_ms(b + 1) <= tpot_ms:
        b += 1
    return b, round(b / ((outputs - 1) * step_ms(b) / 1e3), 1)


def markdown_table(rows: list[dict]) -> str:
    """The step comparison docs/disaggregation.md shows."""
    lines = ["| step | DistServe fit (ms) | vLLM fit (ms) | batchsim (ms) | error vs DistServe | error vs vLLM |",
             "|---|---|---|---|---|---|"]
    for i in range(0, len(rows), 2):
        d, v = rows[i], rows[i + 1]
        lines.append(f"| {d['step']} | {d['fitted_ms']:.1f} | {v['fitted_ms']:.1f} | {d['batchsim_ms']:.1f} | "
                     f"{d['error']:+.0%} | {v['error']:+.0%} |")
    return "\n".join(lines)


def main() -> None:
    rows = step_rows()
    print(f"{'step':24} {'fit':9} {'fitted':>8} {'batchsim':>9} {'error':>7}  result (±{TOLERANCE:.0%})")
    for r in rows:
        print(f"{r['step']:24} {r['fit']:9} {r['fitted_ms']:8.1f} {r['batchsim_ms']:9.1f} {r['error']:+7.1%}  "
              f"{'pass' if r['within'] else 'miss'}")
    for engine in FITS:
        ok = [r["within"] for r in rows if r["fit"] == engine]
        print(f"against the {engine} fit: {sum(ok)}/{len(ok)} within ±{TOLERANCE:.0%}")
    print("prefill-only capacity, one 512-token prompt at a time, P90 TTFT <= 0.4 s (M/D/1):")
    for label, d in [(f"{e} fit", fitted_prefill_ms(e, [PROMPT])) for e in FITS] + \
                    [("batchsim", rows[0]["batchsim_ms"])]:
        print(f"  D = {d:6.1f} ms ({label}): {md1_p90_rate(d / 1e3):.2f} req/s (DistServe's Figure 1: 5.6)")
    print("decode-only capacity, 64 outputs, TPOT <= 40 ms (Little's law on the step time):")
    cm_rows = {b: batchsim_ms(StepShape.of([(1, CONTEXT)] * b)) for b in range(1, 257)}
    for label, fn in [(f"{e} fit", lambda b, e=e: fitted_decode_ms(e, b, CONTEXT)) for e in FITS] + \
                     [("batchsim", cm_rows.__getitem__)]:
        b, rate = decode_only_rate(fn)
        print(f"  {label:14}: batch {b}, {rate} req/s (DistServe's Figure 1: 10)")
    print()
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
