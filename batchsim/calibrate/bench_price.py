"""Time ``RooflineCostModel.price`` on the shapes the simulator sends it.

``python -m batchsim.calibrate.bench_price [MODEL] [HARDWARE]`` prices 256-row decode
steps (every row's context different, as in a real run), mixed
prefill+decode steps and 1-row steps, and prints microseconds per call. The
dense part is memoised per (tokens, sampled), so the first call for a new
token count is slower; the figures below are steady state and cold.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from batchsim.calibrate.costmodel import RooflineCostModel
from batchsim.calibrate.hardware import load_hardware
from batchsim.calibrate.models import load_model
from batchsim.sim.types import StepShape


def _time(fn, shapes: list[StepShape]) -> float:
    t0 = time.perf_counter()
    for s in shapes:
        fn(s)
    return (time.perf_counter() - t0) / len(shapes) * 1e6


def main(model: str = "llama-3-8b", hardware: str = "h100-sxm", n: int = 20000) -> dict[str, float]:
    """Microseconds per ``price`` call for a few step kinds."""
    rng = np.random.default_rng(0)
    cm = RooflineCostModel(load_model(model), load_hardware(hardware))
    ones = np.ones(256, dtype=np.int64)
    decode = [StepShape(q=ones, kv=rng.integers(1, 4000, 256), sampled=256) for _ in range(n)]
    mixed_q = np.concatenate([[512], np.ones(255, dtype=np.int64)])
    mixed = [StepShape(q=mixed_q, kv=rng.integers(0, 4000, 256), sampled=256) for _ in range(n)]
    single = [StepShape(q=np.array([1]), kv=np.array([int(k)]), sampled=1) for k in rng.integers(1, 4000, n)]
    out = {}
    for name, shapes in (("decode-256", decode), ("mixed-256", mixed), ("decode-1", single)):
        cm.price(shapes[0])  # warm the memo for this token count
        out[name] = _time(cm.price, shapes)
    cold = RooflineCostModel(load_model(model), load_hardware(hardware))
    varied = [StepShape(q=np.array([t]), kv=np.array([0]), sampled=1) for t in range(1, 2001)]
    out["cold (new token count)"] = _time(cold.price, varied)
    out["breakdown=True, decode-256"] = _time(lambda s: cm.price(s, breakdown=True), decode[:2000])
    return out


if __name__ == "__main__":  # pragma: no cover
    for k, v in main(*sys.argv[1:3]).items():
        print(f"{k:28s} {v:8.1f} us/call")
