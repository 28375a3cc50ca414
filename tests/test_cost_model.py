"""The roofline cost model: hand-worked FLOPs and bytes, TP, GQA, MoE, the ridge, totals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchsim.calibrate.costmodel import RooflineCostModel
from batchsim.calibrate.hardware import HardwareProfile, hardware_names, load_hardware
from batchsim.calibrate.models import ModelSpec, load_model
from batchsim.sim.errors import InputError
from batchsim.sim.protocols import CostModel
from batchsim.sim.types import StepShape

# d=8, L=2, h=2 query heads, 1 KV head, d_h=4, f=16, V=32: small enough to check by hand.
TINY = ModelSpec(name="tiny", hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=16, vocab_size=32, max_position_embeddings=64)


def flat_profile(compute: float = 1.0, memory: float = 1.0, tflops: float = 100.0, bw_gbs: float = 1000.0,
                 launch_us: float = 0.0, host_us: float = 0.0, per_seq_us: float = 0.0,
                 measured_range: dict | None = None) -> HardwareProfile:
    """A profile with constant efficiencies (a pure roofline), for exact checks."""
    eff = {"compute": [[1, compute]], "memory": [[1, memory]]}
    if measured_range:
        eff["measured_range"] = measured_range
    data = {
        "name": "flat", "calibrated": measured_range is not None,
        "peak_tflops": {"bf16": tflops, "fp8": 2 * tflops}, "memory_gib": 80, "hbm_bandwidth_gbs": bw_gbs,
        "interconnect": {"name": "link", "bandwidth_gbs": 100.0, "latency_us": 10.0, "efficiency": 1.0},
        "launch_latency_us": launch_us, "host_overhead": {"per_step_us": host_us, "per_seq_us": per_seq_us},
        "memory_reserve_gib": 1.0,
        "efficiency": {c: dict(eff) for c in ("gemm", "attention_prefill", "attention_decode", "elementwise")},
        "provenance": {k: "test" for k in ("peak_tflops", "memory", "hbm_bandwidth", "interconnect", "efficiency")},
    }
    if measured_range:
        data["provenance"]["calibration"] = {"device": "test", "software": {}, "date": "2025-01-01"}
    return HardwareProfile.model_validate(data)


def ops(cost) -> dict:
    return {o.name: o for o in cost.breakdown}


# -- FLOPs and bytes by hand ------------------------------------------------------------------------

def test_tiny_config_flops_and_bytes_by_hand():
    cm = RooflineCostModel(TINY, flat_profile())
    # a 3-token prompt (samples) and a decode at 5 cached tokens (samples): T = 4, S = 2
    c = ops(cm.price(StepShape.of([(3, 0), (1, 5)]), breakdown=True))
    # qkv: L * 2*T*d*(h+2k)*d_h = 2*2*4*8*16; bytes L*(weights 8*16*2 + in 4*8*2 + out 4*16*2)
    assert (c["qkv_proj"].flops, c["qkv_proj"].bytes) == (2048, 896)
    assert (c["o_proj"].flops, c["o_proj"].bytes) == (1024, 512)          # 2*2*4*8*8; 2*(128+64+64)
    assert (c["mlp_gate_up"].flops, c["mlp_gate_up"].bytes) == (4096, 1664)  # N = 2f = 32
    assert (c["mlp_down"].flops, c["mlp_down"].bytes) == (2048, 896)
    assert (c["mlp_act"].flops, c["mlp_act"].bytes) == (640, 768)         # 2*5*4*16; 2*4*(32+16)*2
    # lm_head for S=2 rows: 2*S*d*V; weights 8*32*2 + in 2*8*2 + fp32 logits 2*32*4
    assert (c["lm_head"].flops, c["lm_head"].bytes) == (1024, 800)
    # attention: prefill pairs = 3*(0+2) = 6, decode context 6; 4*pairs*h*d_h per layer
    # bytes: K+V of one token = 2*1*4*2 = 16, Q read + O write = 2*4*2*2 = 32 per query token
    assert c["attention"].flops == 2 * 4 * 6 * 2 * 4 + 2 * 4 * 6 * 2 * 4
    assert c["attention"].bytes == 2 * (3 * 16 + 3 * 32) + 2 * (6 * 16 + 1 * 32)
    assert c["kv_cache_write"].bytes == 2 * 4 * 2 * 1 * 4 * (2 + 2)
    assert (c["norms"].flops, c["norms"].bytes) == (5 * 5 * 4 * 8, 5 * 4 * 4 * 8 * 2)
    assert c["embedding"].bytes == 4 * 8 * 2 * 2 + 4 * 4


def test_flat_roofline_time_is_max_of_flops_and_bytes_per_kernel():
    cm = RooflineCostModel(TINY, flat_profile(tflops=1e-6, bw_gbs=1.0, launch_us=2.0))  # 1 MFLOP/s, 1 GB/s
    c = ops(cm.price(StepShape.of([(3, 0), (1, 5)]), breakdown=True))
    # qkv_proj: 2 kernels; compute 2048 FLOP / 1e6 = 2.048 ms > memory 896 B / 1e9
    assert c["qkv_proj"].seconds == pytest.approx(2048 / 1e6 + 2 * 2e-6)
    assert c["qkv_proj"].bound == "compute"


def test_seconds_is_the_sum_of_parts_and_breakdown_sums_to_totals():
    cm = RooflineCostModel(load_model("llama-3-8b"), load_hardware("h100-sxm"))
    for rows in ([(1, 100)] * 7, [(2048, 0)], [(300, 1200)] + [(1, 900)] * 40):
        fast, slow = cm.price(StepShape.of(rows)), cm.price(StepShape.of(rows), breakdown=True)
        for c in (fast, slow):
            assert c.seconds == c.compute_s + c.memory_s + c.network_s + c.overhead_s
        assert slow.seconds == pytest.approx(fast.seconds, rel=1e-12)
        assert (slow.flops, slow.bytes) == pytest.approx((fast.flops, fast.bytes), rel=1e-12)
        assert sum(o.seconds for o in slow.breakdown) == pytest.approx(slow.seconds, rel=1e-12)
        assert fast.breakdown is None


def test_empty_shape_costs_nothing_and_protocol_holds():
    cm = RooflineCostModel(TINY, flat_profile(host_us=100))
    empty = cm.price(StepShape.of([]))
    assert (empty.seconds, empty.flops, empty.bytes) == (0.0, 0.0, 0.0)
    assert isinstance(cm, CostModel)


def test_host_overhead_is_constant_plus_per_sequence():
    cm = RooflineCostModel(TINY, flat_profile(host_us=100, per_seq_us=10))
    h1 = ops(cm.price(StepShape.of([(1, 5)]), breakdown=True))["host"].seconds
    h4 = ops(cm.price(StepShape.of([(1, 5)] * 4), breakdown=True))["host"].seconds
    assert (h1, h4) == pytest.approx((110e-6, 140e-6))


def test_lm_head_only_for_sampled_rows():
    cm = RooflineCostModel(TINY, flat_profile())
    chunk = StepShape(q=np.array([16]), kv=np.array([0]), sampled=0)  # a prefill chunk that does not finish
    assert "lm_head" not in ops(cm.price(chunk, breakdown=True))
    assert ops(cm.price(StepShape.of([(16, 0)]), breakdown=True))["lm_head"].flops == 2 * 1 * 8 * 32


# -- tensor parallelism, GQA, MoE ------------------------------------------------------------------------

def test_tp_halves_per_shard_gemm_work_and_adds_allreduce():
    model, hw = load_model("llama-2-7b"), load_hardware("h100-sxm")
    one, two = RooflineCostModel(model, hw, tp=1), RooflineCostModel(model, hw, tp=2)
    shape = StepShape.of([(2048, 0)])
    a, b = ops(one.price(shape, breakdown=True)), ops(two.price(shape, breakdown=True))
    for name in ("qkv_proj", "o_proj", "mlp_gate_up", "mlp_down"):
        assert b[name].flops == a[name].flops  # replica totals are the same work...
        w1 = next(w for w in one.shard.dense(2048, 1) if w.name == name)
        w2 = next(w for w in two.shard.dense(2048, 1) if w.name == name)
        assert w2.flops == w1.flops / 2  # ...split over two shards
        launch = w1.kernels * hw.launch_latency_us * 1e-6
        assert (b[name].seconds - launch) == pytest.approx((a[name].seconds - launch) / 2, rel=1e-9)
    assert "allreduce" not in a and b["allreduce"].bound == "network"
    msg = 2048 * 4096 * 2  # T * d * 2 bytes, two all-reduces per layer, ring over 2 GPUs
    link = hw.interconnect
    expect = 2 * 32 * (link.latency_us * 1e-6 + msg / (link.bandwidth_gbs * 1e9 * link.efficiency))
    assert b["allreduce"].seconds == pytest.approx(expect)
    assert two.weight_bytes_per_gpu < 0.52 * one.weight_bytes_per_gpu


def test_gqa_shrinks_decode_kv_bytes_by_the_group_factor():
    mha = ModelSpec(name="mha", hidden_size=4096, num_hidden_layers=2, num_attention_heads=32,
                    num_key_value_heads=32, intermediate_size=8192, vocab_size=1000, max_position_embeddings=8192)
    gqa = mha.model_copy(update={"name": "gqa", "num_key_value_heads": 4})
    hw = flat_profile()
    shape = StepShape.of([(1, 4000)] * 8)
    per_query = 2 * 8 * 32 * 128 * 2 * 2  # Q read + O write, 8 rows, 2 layers: the same for both
    a = ops(RooflineCostModel(mha, hw).price(shape, breakdown=True))["attention"]
    b = ops(RooflineCostModel(gqa, hw).price(shape, breakdown=True))["attention"]
    assert (a.bytes - per_query) == 8 * (b.bytes - per_query)
    assert a.flops == b.flops  # FLOPs follow query heads
    assert RooflineCostModel(mha, hw).kv_bytes_per_token == 8 * RooflineCostModel(gqa, hw).kv_bytes_per_token


def test_moe_weights_read_grow_with_batch_until_every_expert_is_touched():
    cm = RooflineCostModel(load_model("mixtral-8x7b"), load_hardware("h100-sxm"))
    L, d, f, k = 32, 4096, 14336, 2
    expert = d * 2 * f * 2  # one expert's gate+up weights, bf16

    def weights_read(batch: int) -> float:
        op = ops(cm.price(StepShape.of([(1, 100)] * batch), breakdown=True))["moe_gate_up"]
        return op.bytes - L * batch * k * (d + 2 * f) * 2  # minus gathered activations in and out

    reads = [weights_read(b) for b in (1, 2, 4, 8, 16, 64, 512)]
    assert reads == sorted(reads)
    assert reads[0] == pytest.approx(L * k * expert)  # one token touches exactly k experts
    assert reads[-1] == pytest.approx(L * 8 * expert)  # a big batch touches all 8
    assert cm.shard.touched_experts(2) == pytest.approx(8 * (1 - (6 / 8) ** 2))
    flops = [ops(cm.price(StepShape.of([(1, 100)] * b), breakdown=True))["moe_gate_up"].flops for b in (1, 2)]
    assert flops[1] == 2 * flops[0] == 2 * (L * 2 * k * d * 2 * f)  # FLOPs for k experts per token


# -- the ridge point and the headline numbers ------------------------------------------------------------

def _knee(cm: RooflineCostModel, op: str, lo: int = 1, hi: int = 8192) -> int:
    """Smallest prefill token count at which ``op`` is compute-bound (binary search)."""
    def compute_bound(t: int) -> bool:
        return ops(cm.price(StepShape(q=np.array([t]), kv=np.array([0]), sampled=0), breakdown=True))[op].bound == "compute"
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid + 1, hi)
    return lo


def test_gemm_knee_sits_at_the_ridge_point_of_a_flat_roofline():
    hw = flat_profile(tflops=989.4, bw_gbs=3350.0)
    cm = RooflineCostModel(load_model("llama-2-7b"), hw)
    ridge = 989.4e12 / 3350e9  # FLOP per byte
    K, N = 4096, 3 * 4096  # fused QKV of Llama-2-7B
    # 2MKN/P = (2KN + 2M(K+N))/B  =>  M* = ridge / (1 - ridge (K+N)/(KN)); activations move it right
    expect = ridge / (1 - ridge * (K + N) / (K * N))
    assert _knee(cm, "qkv_proj") == math.ceil(expect)


@pytest.mark.parametrize("hw_name", sorted(hardware_names()))
def test_catalog_gemm_knee_follows_each_devices_achieved_ridge(hw_name):
    # With real curves the ridge is the achieved one, (e_c * peak) / (e_m * bandwidth); tile
    # quantisation (Vidur's A100 timings leave the memory floor between 64 and 128 tokens)
    # starts the climb a little before it.
    hw = load_hardware(hw_name)
    cm = RooflineCostModel(load_model("llama-2-7b"), hw)
    gemm = hw.efficiency["gemm"]
    achieved = hw.peak_flops("bf16") * gemm.compute[-1][1] / (hw.bandwidth * gemm.memory[-1][1])
    assert achieved / 4 <= _knee(cm, "mlp_gate_up") <= achieved


def test_knee_moves_with_the_ridge():
    knees = {n: _knee(RooflineCostModel(load_model("llama-2-7b"), load_hardware(n)), "mlp_gate_up")
             for n in ("a100-80gb", "h100-sxm")}
    assert 64 <= knees["a100-80gb"] <= 128 < knees["h100-sxm"]


def test_llama3_8b_decode_on_h100_is_weights_over_bandwidth_plus_overhead():
    cm = RooflineCostModel(load_model("llama-3-8b"), load_hardware("h100-sxm"))
    cost = cm.price(StepShape.of([(1, 512)]))
    achieved_bw = cm.hardware.bandwidth * cm.hardware.efficiency["gemm"].memory[-1][1]
    floor = cm.weight_bytes_per_gpu / achieved_bw
    assert cost.compute_s == 0.0 and cost.memory_s > floor  # every operator is memory-bound
    assert 1.0 <= cost.seconds / (floor + cost.overhead_s) <= 1.3  # per-kernel ramp is the rest
    assert 5.5e-3 < cost.seconds < 8e-3


def test_2048_token_prefill_is_compute_bound():
    cm = RooflineCostModel(load_model("llama-3-8b"), load_hardware("h100-sxm"))
    cost = cm.price(StepShape.of([(2048, 0)]))
    assert cost.compute_s > 3 * cost.memory_s
    assert 0.4 < cost.flops / (cost.seconds * cm.peak_flops) < 0.75  # MFU of a long prefill


# -- dtypes, KV capacity, validation --------------------------------------------------------------------

def test_dtypes_set_bytes_and_compute_peak():
    model = load_model("llama-3-8b")
    h100, a100 = load_hardware("h100-sxm"), load_hardware("a100-80gb")
    bf16, fp8, int4 = (RooflineCostModel(model, h100, dtype=d) for d in ("bf16", "fp8", "int4"))
    assert fp8.compute_dtype == "fp8" and fp8.peak_flops == pytest.approx(1978.9e12)
    assert RooflineCostModel(model, a100, dtype="fp8").compute_dtype == "bf16"  # weight-only fp8 on A100
    assert int4.compute_dtype == "fp16" and int4.kv_dtype == "bf16" and fp8.kv_dtype == "fp8"
    emb = 2 * 128256 * 4096 * 2  # embedding + LM head stay 16-bit
    assert fp8.weight_bytes_per_gpu - emb == pytest.approx((bf16.weight_bytes_per_gpu - emb) / 2, rel=1e-3)
    assert int4.weight_bytes_per_gpu < fp8.weight_bytes_per_gpu
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token / 2 == 32 * 2 * 8 * 128


def test_kv_capacity_formula():
    cm = RooflineCostModel(load_model("llama-3-8b"), load_hardware("h100-sxm"))
    gib = 2**30
    act = cm.shard.activation_bytes(8192, 256)
    free = 80 * gib * 0.9 - cm.weight_bytes_per_gpu - 1.0 * gib - act
    assert cm.kv_capacity_tokens(0.9) == int(free // (32 * 2 * 8 * 128 * 2))
    assert 400_000 < cm.kv_capacity_tokens(0.9) < 500_000
    assert cm.kv_capacity_blocks(0.9, block_size=16) == cm.kv_capacity_tokens(0.9) // 16
    tp2 = RooflineCostModel(load_model("llama-3-8b"), load_hardware("h100-sxm"), tp=2)
    assert tp2.kv_capacity_tokens(0.9) > 2 * cm.kv_capacity_tokens(0.9)  # KV heads split, weights halved


def test_kv_capacity_error_names_model_hardware_tp_and_numbers():
    cm = RooflineCostModel(load_model("llama-3.1-405b"), load_hardware("h100-sxm"), tp=8)
    with pytest.raises(InputError) as e:
        cm.kv_capacity_tokens(0.9)
    msg = str(e.value)
    for part in ("llama-3.1-405b", "h100-sxm", "tp=8", "GiB", "weights take 94.5"):
        assert part in msg
    fp8 = RooflineCostModel(load_model("llama-3.1-405b"), load_hardware("h100-sxm"), tp=8, dtype="fp8")
    assert fp8.kv_capacity_tokens(0.9) > 0


def test_bad_tp_and_dtype_are_input_errors():
    model, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    with pytest.raises(InputError, match="tp=3"):
        RooflineCostModel(model, hw, tp=3)
    with pytest.raises(InputError, match="fp4"):
        RooflineCostModel(model, hw, dtype="fp4")
    with pytest.raises(InputError, match="int4"):
        RooflineCostModel(model, hw, kv_dtype="int4")
    RooflineCostModel(load_model("llama-2-70b"), hw, tp=16)  # more shards than KV heads: replicated


# -- out-of-range counting ------------------------------------------------------------------------------

def test_out_of_range_counts_operators_outside_calibrated_sizes():
    wide = {"tokens": [1, 1e9], "bytes": [1, 1e15]}
    prof = flat_profile(measured_range=wide)
    data = prof.model_dump(mode="json")
    data["efficiency"]["gemm"]["measured_range"] = {"tokens": [16, 1024], "bytes": [1, 1e15]}
    cm = RooflineCostModel(TINY, HardwareProfile.model_validate(data))
    gemms = 5  # qkv, o, gate_up, down, lm_head
    assert cm.price(StepShape.of([(1, 10)])).out_of_range == gemms  # M = 1 < 16
    assert cm.price(StepShape.of([(64, 0)])).out_of_range == 1  # only lm_head (M = 1 sampled row)
    assert cm.price(StepShape.of([(4096, 0)]), breakdown=True).out_of_range == gemms
    assert RooflineCostModel(TINY, flat_profile()).price(StepShape.of([(1, 10)])).out_of_range == 0
