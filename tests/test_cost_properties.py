"""Invariants of ``price`` over random step shapes (Hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsim.calibrate.costmodel import RooflineCostModel
from batchsim.calibrate.hardware import load_hardware
from batchsim.calibrate.models import load_model
from batchsim.sim.types import StepShape

CM = RooflineCostModel(load_model("llama-3-8b"), load_hardware("h100-sxm"), tp=2)
MOE = RooflineCostModel(load_model("mixtral-8x7b"), load_hardware("a100-80gb"), tp=2)

rows = st.lists(st.tuples(st.integers(0, 600), st.integers(0, 6000)), min_size=1, max_size=40)


def shape(rs: list[tuple[int, int]], sampled: int | None = None) -> StepShape:
    return StepShape.of(rs, sampled=len(rs) if sampled is None else sampled)


@settings(max_examples=60, deadline=None)
@given(rows, st.sampled_from([CM, MOE]))
def test_fast_path_equals_breakdown_and_parts_add_up(rs, cm):
    fast, slow = cm.price(shape(rs)), cm.price(shape(rs), breakdown=True)
    assert fast.seconds == pytest.approx(slow.seconds, rel=1e-9)
    assert fast.flops == pytest.approx(slow.flops, rel=1e-9)
    assert fast.bytes == pytest.approx(slow.bytes, rel=1e-9)
    assert fast.out_of_range == slow.out_of_range == 0
    assert fast.seconds == fast.compute_s + fast.memory_s + fast.network_s + fast.overhead_s
    assert min(fast.compute_s, fast.memory_s, fast.network_s, fast.overhead_s) >= 0.0


@settings(max_examples=60, deadline=None)
@given(rows, st.data())
def test_more_context_never_costs_less(rs, data):
    i = data.draw(st.integers(0, len(rs) - 1))
    q, kv = rs[i]
    more = list(rs)
    more[i] = (q, kv + data.draw(st.integers(1, 4000)))
    if q == 1 and kv == 0:  # a 1-token prompt would turn into a decode: a different kernel
        return
    assert CM.price(shape(more)).seconds >= CM.price(shape(rs)).seconds


@settings(max_examples=40, deadline=None)
@given(rows, st.integers(1, 8000))
def test_another_decode_row_never_costs_less(rs, ctx):
    assert CM.price(shape(rs + [(1, ctx)])).seconds >= CM.price(shape(rs)).seconds


def test_padding_rows_with_no_tokens_read_nothing():
    base = CM.price(shape([(100, 0), (1, 50)]), breakdown=True)
    padded = CM.price(StepShape(q=np.array([100, 1, 0]), kv=np.array([0, 50, 4000]), sampled=2), breakdown=True)
    assert padded.flops == base.flops and padded.bytes == base.bytes
