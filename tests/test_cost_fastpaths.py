"""The cost model's fast paths give the plain paths' results bit for bit.

``price`` inlines the attention operators and skips work for all-decode
steps; it is compared here with the plain code it replaces (kept in the
module for breakdowns and uncommon inputs), with ``==`` on floats, which is
bit equality for non-NaN.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from batchsim.calibrate import costmodel
from batchsim.calibrate.costmodel import RooflineCostModel
from batchsim.calibrate.hardware import load_hardware
from batchsim.calibrate.models import load_model
from batchsim.sim.types import StepCost, StepShape
from tests.engine_helpers import _calibrated_like


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


def test_fast_step_cost_is_a_plain_step_cost():
    args = (1.0, 2.0, 3.0, 0.5, 0.25, 0.125, 0.0625, 3)
    fast, plain = costmodel._step_cost(*args), StepCost(*args)
    assert type(fast) is StepCost and fast == plain and hash(fast) == hash(plain) and repr(fast) == repr(plain)
    assert vars(fast) == vars(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.seconds = 2.0
