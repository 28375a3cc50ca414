"""Fitting profiles to timed kernels (no torch): plans, work, curve and host fits, operator curves."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchsim.calibrate.costmodel import RooflineCostModel
from batchsim.calibrate.fit import (ELEMENTWISE, HELD_OUT_GEMM, Case, Sample, _grid, fit_class, fit_efficiency, fit_host,
                           held_out_error, plan_steps, predict_seconds, samples_of, step_works)
from batchsim.calibrate.hardware import Efficiency, HardwareProfile, load_hardware
from batchsim.calibrate.models import load_model
from batchsim.calibrate.work import ShardShape
from batchsim.sim.types import StepShape

TINY = load_model("tiny-llama")


def test_grid_alternates_held_out_and_avoids_powers_of_two():
    g = _grid(4096)
    sizes = [n for n, _ in g]
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] <= 4096
    assert sum(held for _, held in g) >= len(g) // 2 - 1
    big = [n for n in sizes if n > 16]
    assert sum(n & (n - 1) == 0 for n in big) == 0  # no power of two past 16


def test_plan_sweeps_decodes_prefills_and_chunks_ordered_by_kv_need():
    plan = plan_steps("cpu", quick=True)
    shapes = [s for s, _ in plan]
    needs = [(int((s.q + s.kv).max()), s.num_rows) for s in shapes]
    assert needs == sorted(needs)
    decodes = [s for s in shapes if (s.q == 1).all() and (s.kv > 0).all()]
    assert {16, 128, 512} <= {int(s.kv[0]) for s in decodes} and max(s.num_rows for s in decodes) == 25
    prefills = [s for s in shapes if s.num_rows == 1 and s.kv[0] == 0]
    assert max(s.num_tokens for s in prefills) <= 2048 and min(s.num_tokens for s in prefills) == 1
    assert any(s.num_rows == 4 and (s.kv == 0).all() for s in shapes)  # a padded batch's prefill
    assert any(s.num_rows == 1 and s.kv[0] == 3 * s.q[0] for s in shapes)  # chunks over a context
    assert 0.3 < sum(h for _, h in plan) / len(plan) < 0.7
    assert len(plan_steps("cpu", quick=False)) > len(plan)
    assert max(int(s.q.max()) for s, _ in plan_steps("cuda", quick=False)) == max(n for n, _ in _grid(16384))


def test_step_works_split_attention_as_the_cost_model_does():
    shard = ShardShape.of(TINY, 1, "bf16", "bf16")
    works = step_works(TINY, StepShape.of([(1, 99)] * 4 + [(10, 5)]))
    assert works["qkv_proj"].flops == 2 * 14 * 256 * shard.qkv_width and works["qkv_proj"].tokens == 14
    assert works["attention_decode"].tokens == 4
    assert works["attention_decode"].flops == pytest.approx(4 * 4 * 100 * 8 * 32)
    assert works["attention_prefill"].tokens == 10
    assert works["attention_prefill"].flops == pytest.approx(4 * 10 * (5 + 5.5) * 8 * 32)
    assert works["norms"].bytes == pytest.approx(4 * 14 * 256 * 2) and works["lm_head"].tokens == 5
    assert "attention_prefill" not in step_works(TINY, StepShape.of([(1, 7)]))


def test_samples_take_the_median_call_and_hold_out_the_o_proj_shape():
    plan = [(StepShape.of([(8, 0)]), False), (StepShape.of([(1, 20)] * 2), True)]
    kernels = [{"qkv_proj": [3.0, 1.0, 2.0], "o_proj": [1.0]}, {"attention_decode": [5.0, 7.0]}]
    by = {(s.case.kernel, s.case.size): s for s in samples_of(TINY, plan, kernels)}
    assert by[("qkv_proj", (1, 8, 8))].seconds == 2.0 and not by[("qkv_proj", (1, 8, 8))].case.held_out
    assert by[("o_proj", (1, 8, 8))].case.held_out
    dec = by[("attention_decode", (2, 2, 21))]
    assert dec.seconds == 6.0 and dec.case.held_out and dec.op_class == "attention_decode"


def _sample(kernel: str, shape: StepShape, seconds: float, held_out: bool = False, model=TINY) -> Sample:
    w = step_works(model, shape)[kernel]
    size = (shape.num_rows, shape.num_tokens, int((shape.q + shape.kv).max()))
    return Sample(Case(model.name, kernel, size, held_out), w.op_class, w.flops, w.bytes, w.tokens, seconds)


def test_predict_seconds_matches_the_cost_model():
    hw = load_hardware("h100-sxm")
    m = load_model("llama-3-8b")
    cm = RooflineCostModel(m, hw)
    shard = ShardShape.of(m, 1, "bf16", "bf16")
    for tokens in (1, 64, 4096):
        s = _sample("qkv_proj", StepShape.of([(tokens, 0)]), 1.0, model=m)
        want = cm.gemm_seconds(tokens, 4096, shard.qkv_width) + hw.launch_latency_us * 1e-6
        assert predict_seconds(hw, s) == pytest.approx(want, rel=1e-12)


def _profile_with(**efficiency: Efficiency) -> HardwareProfile:
    data = load_hardware("h100-sxm").model_dump(mode="json")
    data["efficiency"].update({k: v.model_dump(mode="json") for k, v in efficiency.items()})
    return HardwareProfile.model_validate(data)


def test_an_operator_curve_overrides_its_class_in_the_cost_model():
    slow = Efficiency(compute=[(1.0, 0.001)], memory=[(1.0, 0.001)])
    hw = _profile_with(norms=slow)
    shape = StepShape.of([(128, 0)])
    base = {o.name: o.seconds for o in RooflineCostModel(TINY, load_hardware("h100-sxm")).price(shape, True).breakdown}
    got = {o.name: o.seconds for o in RooflineCostModel(TINY, hw).price(shape, True).breakdown}
    assert got["norms"] > 10 * base["norms"]
    assert got["rotary"] == base["rotary"] and got["qkv_proj"] == base["qkv_proj"]
    s = _sample("norms", shape, 1.0)
    assert predict_seconds(hw, s) > 10 * predict_seconds(load_hardware("h100-sxm"), s)


def test_unknown_efficiency_entry_is_rejected():
    data = load_hardware("h100-sxm").model_dump(mode="json")
    data["efficiency"]["attention"] = data["efficiency"]["gemm"]
    with pytest.raises(ValueError, match="unknown efficiency entries"):
        HardwareProfile.model_validate(data)


def _truth_samples(hw: HardwareProfile, noise: float = 0.0, seed: int = 0) -> list[Sample]:
    """Every kernel of the quick CPU plan, timed by a known profile (optionally with noise)."""
    rng = np.random.default_rng(seed)
    out = []
    for shape, held in plan_steps("cpu", quick=True):
        for kernel in step_works(TINY, shape):
            s = _sample(kernel, shape, 1.0, held or kernel == HELD_OUT_GEMM)
            out.append(Sample(s.case, s.op_class, s.flops, s.bytes, s.tokens,
                              predict_seconds(hw, s) * math.exp(rng.normal(0.0, noise))))
    return out


def test_fit_recovers_a_known_profile_on_held_out_kernels():
    truth = load_hardware("a100-80gb")
    samples = _truth_samples(truth)
    eff = fit_efficiency(samples, truth.peak_flops("bf16"), truth.bandwidth, truth.launch_latency_us * 1e-6)
    fitted = truth.model_copy(update={"efficiency": eff})
    err = held_out_error(fitted, samples)
    assert err["overall"]["n"] > 100
    assert err["overall"]["median"] < 0.05, err
    for op in ELEMENTWISE:  # every elementwise operator gets its own curves
        assert eff[op].measured_range is not None


def test_fit_is_robust_to_noise_and_keeps_fractions_in_range():
    truth = load_hardware("h100-sxm")
    samples = _truth_samples(truth, noise=0.1, seed=3)
    eff = fit_class([s for s in samples if s.op_class == "gemm"], truth.peak_flops("bf16"), truth.bandwidth,
                    truth.launch_latency_us * 1e-6)
    for curve in (eff.compute, eff.memory):
        assert all(0 < f <= 1 for _, f in curve)
        assert [x for x, _ in curve] == sorted(x for x, _ in curve)
    fitted = truth.model_copy(update={"efficiency": dict(truth.efficiency, gemm=eff)})
    assert held_out_error(fitted, samples)["gemm"]["median"] < 0.12


def test_fit_host_recovers_step_and_sequence_overheads():
    shapes = [s for s, _ in plan_steps("cpu", quick=True)]
    rows = np.array([s.num_rows for s in shapes])
    predicted = np.full(len(shapes), 2e-3)
    measured = predicted + 400e-6 + 25e-6 * rows
    host = fit_host(shapes, measured, predicted)
    assert host.per_step_us == pytest.approx(400, abs=15) and host.per_seq_us == pytest.approx(25, abs=2)
    # measured below the kernels' sum: no negative overhead
    zero = fit_host(shapes, predicted * 0.9, predicted)
    assert zero.per_step_us == 0 and zero.per_seq_us == 0 and zero.per_decode_step_us == 0
    assert host.per_decode_step_us == pytest.approx(0, abs=30)


def test_fit_host_recovers_the_decode_steps_extra():
    """Eager decode attention launches more than a prefill's: decode steps' own host term."""
    shapes = [s for s, _ in plan_steps("cuda", quick=False)]
    rows = np.array([s.num_rows for s in shapes])
    dec = np.array([bool(((s.q == 1) & (s.kv > 0)).any()) for s in shapes])
    assert 0 < dec.sum() < len(dec)
    predicted = np.full(len(shapes), 3e-3)
    measured = predicted + 2000e-6 + 10e-6 * rows + 1000e-6 * dec
    host = fit_host(shapes, measured, predicted)
    assert host.per_step_us == pytest.approx(2000, rel=0.03)
    assert host.per_decode_step_us == pytest.approx(1000, rel=0.05)
    assert host.per_seq_us == pytest.approx(10, rel=0.2)


def test_fit_host_recovers_decode_steps_cheaper_than_the_others():
    """Decode steps replayed from CUDA graphs take less host time than eager prefills: the decode
    term comes out negative, and a decode step's own host time is never below zero."""
    shapes = [s for s, _ in plan_steps("cuda", quick=False)]
    rows = np.array([s.num_rows for s in shapes])
    dec = np.array([bool(((s.q == 1) & (s.kv > 0)).any()) for s in shapes])
    predicted = np.full(len(shapes), 3e-3)
    measured = predicted + 2500e-6 + 10e-6 * rows - 2200e-6 * dec  # (graph decode steps: 300 us + rows)
    host = fit_host(shapes, measured, predicted)
    assert host.per_step_us == pytest.approx(2500, rel=0.03)
    assert host.per_decode_step_us == pytest.approx(-2200, rel=0.05)
    assert host.per_seq_us == pytest.approx(10, rel=0.2)
    nothing = fit_host(shapes, predicted + 2500e-6 - 2500e-6 * dec, predicted)  # (graph decode steps: no host time)
    assert nothing.per_step_us + nothing.per_decode_step_us >= 0
    assert nothing.per_decode_step_us == pytest.approx(-nothing.per_step_us, abs=30)


def test_a_profile_refuses_a_decode_step_below_zero_host_time():
    from batchsim.calibrate.hardware import HostOverhead
    from pydantic import ValidationError

    assert HostOverhead(per_step_us=500, per_seq_us=0, per_decode_step_us=-500).per_decode_step_us == -500
    with pytest.raises(ValidationError, match="per_step_us \\+ per_decode_step_us must be >= 0"):
        HostOverhead(per_step_us=500, per_seq_us=0, per_decode_step_us=-600)
