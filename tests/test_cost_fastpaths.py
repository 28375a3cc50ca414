"""The cost model's fast paths give the plain paths' results bit for bit.

``price`` and ``price_decodes`` inline the attention operators and skip work
for all-decode steps; ``Curve.many`` memoises sizes. Each is compared here
with the plain code it replaces (kept in the module for breakdowns and
uncommon inputs), with ``==`` on floats, which is bit equality for non-NaN.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from calibrate import costmodel
from calibrate.costmodel import RooflineCostModel
from calibrate.curves import Curve
from calibrate.hardware import load_hardware
from calibrate.models import load_model
from sim.types import StepCost, StepShape
from tests.test_fast_forward import _calibrated_like


def _fields(c):
    return [(type(v), v) for v in dataclasses.astuple(c)]


@pytest.mark.parametrize("model,hw,tp,dtype", [
    ("llama-3.1-8b", "h100-sxm", 1, "bf16"), ("mixtral-8x7b", "a100-80gb", 2, "fp8"),
    ("tiny-llama", "calibrated", 1, "int4"), ("llama-3-70b", "h200", 4, "bf16"),
])
def test_price_fast_path_equals_plain_path(model, hw, tp, dtype):
    prof = _calibrated_like("h100-sxm") if hw == "calibrated" else load_hardware(hw)
    cm = RooflineCostModel(load_model(model), prof, tp=tp, dtype=dtype)
    rng = np.random.default_rng(3)
    for it in range(400):
        n = int(rng.integers(1, 300))
        q = np.ones(n, dtype=np.int64)
        kv = rng.integers(0 if it % 3 == 0 else 1, 5000, n)
        if it % 2:
            q[: int(rng.integers(1, n + 1))] = rng.integers(0, 900)
        shape = StepShape(q=q, kv=kv, sampled=int(rng.integers(0, n + 1)))
        got = cm.price(shape)
        attn, cm._attn = cm._attn, None  # force the plain path
        try:
            want = cm.price(shape)
        finally:
            cm._attn = attn
        assert _fields(got) == _fields(want), (q, kv)


# model, hardware (or a calibrated-like profile with measured ranges), TP: the runs' cases
RUN_CASES = [("llama-3.1-8b", "h100-sxm", 1), ("tiny-llama", "calibrated", 2), ("mixtral-8x7b", "l4", 2)]


def _run_cost_model(model: str, hw: str, tp: int) -> RooflineCostModel:
    prof = _calibrated_like("h100-sxm") if hw == "calibrated" else load_hardware(hw)
    return RooflineCostModel(load_model(model), prof, tp=tp)


@pytest.mark.parametrize("model,hw,tp", RUN_CASES)
def test_price_decodes_fast_path_equals_plain_path(model, hw, tp):
    cm = _run_cost_model(model, hw, tp)
    rng = np.random.default_rng(5)
    for _ in range(300):
        rows = int(rng.integers(1, 257))
        count = int(rng.integers(1, 80))
        stride = rows * int(rng.choice([0, 1, 3]))
        context = int(rng.integers(0, 3000)) * rows
        sampled = int(rng.integers(0, rows + 1))
        got = cm.price_decodes(rows, context, count, stride, sampled)
        want = cm._price_decodes_slow(rows, context, count, stride, sampled)
        for a, b in zip(got, want):
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
            else:
                assert type(a) is type(b) and a == b
        flops = cm.decode_flops(rows, context, count, stride, sampled)
        assert flops.tobytes() == want.flops.tobytes()


def test_price_decodes_falls_back_past_exact_integers():
    cm = RooflineCostModel(load_model("llama-3.1-8b"), load_hardware("h100-sxm"))
    bk, br = cm._run_bound
    rows = 4
    assert cm._decode_ctx(rows, 1000, 30, rows) is not None
    assert cm._decode_ctx(rows, 10**15, 30, rows) is None and cm._decode_ctx(rows, np.int64(1000), 30, rows) is None
    for context in ((1 << 53) // bk - 200, (1 << 53) // bk - 120, 10**15, np.int64(1000)):
        got = cm.price_decodes(rows, context, 30, rows, rows)
        want = cm._price_decodes_slow(rows, context, 30, rows, rows)
        assert got.seconds.tobytes() == want.seconds.tobytes()
        assert got.bytes.tobytes() == want.bytes.tobytes()


def test_curve_many_memo_matches_scalar_calls():
    curve = Curve([[4096.0, 0.0002], [65536.0, 0.004], [1048576.0, 0.05], [67108864.0, 0.7]])
    rng = np.random.default_rng(1)
    for _ in range(200):
        start = int(rng.integers(1, 10**8))
        step = int(rng.integers(1, 10**6))
        sizes = range(start, start + step * int(rng.integers(1, 50)), step)
        want = [curve(x) for x in sizes]
        assert curve.many(sizes) == want
        assert curve.many(list(sizes)) == want  # memo hits
        assert curve.many([float(x) for x in sizes]) == want
        assert curve.many(iter(sizes)) == want


def test_curve_progression_matches_scalar_calls():
    """Curve.progression (a run's sizes on one lattice, remembered per lattice): the same
    doubles as one call per size, on overlapping runs (lattice hits and misses mixed), past
    the lattice (the dictionary path), with a step of 0, and after its lattices are dropped."""
    from calibrate import curves
    curve = Curve([[4096.0, 0.0002], [65536.0, 0.004], [1048576.0, 0.05], [67108864.0, 0.7]])
    rng = np.random.default_rng(2)
    hits = 0
    for i in range(600):
        scale = int(rng.choice([512, 4096, 131072]))
        offset = int(rng.choice([0, 64, 4096 * 3, 1000 + i]))
        x0 = int(rng.integers(0, curves._LATTICE_X + 50 if i % 10 == 0 else 3000))
        step = int(rng.integers(0, 9))
        count = int(rng.integers(1, 400))
        grid = curve._lattice.get((offset, scale))
        before = 0 if grid is None else int((~np.isnan(grid)).sum())
        got = curve.progression(x0, step, count, scale, offset)
        want = [curve(offset + scale * (x0 + step * j)) for j in range(count)]
        assert got.tolist() == want
        hits += before > 0
        got[:] = 0.0  # a new array: the remembered values stay
        assert curve.progression(x0, step, count, scale, offset).tolist() == want
    assert hits > 200 and len(curve._lattice) <= curves._LATTICE_KEYS


def test_fast_step_cost_is_a_plain_step_cost():
    args = (1.0, 2.0, 3.0, 0.5, 0.25, 0.125, 0.0625, 3)
    fast, plain = costmodel._step_cost(*args), StepCost(*args)
    assert type(fast) is StepCost and fast == plain and hash(fast) == hash(plain) and repr(fast) == repr(plain)
    assert vars(fast) == vars(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.seconds = 2.0


@pytest.mark.parametrize("model,hw,tp", RUN_CASES)
def test_price_decode_segments_equals_price_decodes_per_segment(model, hw, tp):
    """Stretches of decode steps priced in one call give each stretch's price_decodes."""
    cm = _run_cost_model(model, hw, tp)
    rng = np.random.default_rng(8)
    for _ in range(200):
        segs, rows, ctx = [], int(rng.integers(2, 257)), int(rng.integers(1, 4000))
        for _ in range(int(rng.integers(1, 5))):
            count = int(rng.integers(1, 60))
            segs.append((rows, rows * ctx, count))
            ctx += count
            rows = max(1, rows - int(rng.integers(1, 8)))
        if rng.random() < 0.05:
            segs[-1] = (segs[-1][0], 10**15, segs[-1][2])  # past exact integers: the plain path
        got = cm.price_decode_segments(segs)
        parts = [cm.price_decodes(r, c, n, r, r) for r, c, n in segs]
        for name in ("seconds", "flops", "bytes", "compute_s", "memory_s", "out_of_range"):
            want = np.concatenate([getattr(p, name) for p in parts])
            assert getattr(got, name).tobytes() == want.tobytes(), name
        steps = [p.step(i) for p in parts for i in range(len(p.seconds))]
        assert [got.step(j) for j in range(len(steps))] == steps
