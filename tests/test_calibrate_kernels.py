"""The torch kernels shared by calibration and the executor: exact against plain references."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from batchsim.calibrate import kernels as K  # noqa: E402
from batchsim.sim.errors import InputError  # noqa: E402

CPU = torch.device("cpu")


def _naive_attention(q, k, v, kv_before: int):
    """q [n, h, d], k/v [ctx, hk, d]; query i sees keys <= kv_before + i."""
    n, h, d = q.shape
    group = h // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,chd->hnc", q, k) / d**0.5
    ctx = k.shape[0]
    allowed = torch.arange(ctx)[None, :] <= (kv_before + torch.arange(n))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hnc,chd->nhd", scores.softmax(-1), v).reshape(n, h * d)


def test_add_rms_norm_adds_in_place_then_normalises():
    x, res, w = torch.randn(5, 16), torch.randn(5, 16), torch.rand(16)
    want_res = x + res
    want = want_res / want_res.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w
    got, new_res = K.add_rms_norm(x, res, w)
    assert new_res is res and torch.allclose(new_res, want_res)
    assert torch.allclose(got, want, atol=1e-5)
    first, kept = K.add_rms_norm(x, None, w)
    assert kept is x


def test_rotary_is_rotate_half_rope():
    cos, sin = K.rope_tables(32, 8, CPU, torch.float32)
    x = torch.randn(3, 2, 8)
    pos = torch.tensor([0, 5, 31])
    got = K.rotary(x, cos[pos].unsqueeze(1), sin[pos].unsqueeze(1))
    inv = 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)
    ang = pos[:, None].float() * inv[None, :]
    c, s = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    rotated = torch.cat([-x[..., 4:], x[..., :4]], dim=-1)
    assert torch.allclose(got, x * c + rotated * s, atol=1e-6)
    assert torch.allclose(got[0], x[0])  # position 0 is the identity


def test_write_kv_then_prefill_attention_matches_a_naive_causal_gqa():
    h, hk, d, kv, n = 4, 2, 8, 5, 3
    kc, vc = torch.zeros(3, hk, 16, d), torch.zeros(3, hk, 16, d)
    keys, vals = torch.randn(kv + n, hk, d), torch.randn(kv + n, hk, d)
    K.write_kv(kc, vc, keys, vals, torch.full((kv + n,), 2), torch.arange(kv + n))
    assert torch.equal(kc[2, :, : kv + n].transpose(0, 1), keys) and kc[0].abs().sum() == 0
    q = torch.randn(n, h, d)
    got = K.prefill_attention(q, kc, vc, [2], kv)
    assert torch.allclose(got, _naive_attention(q, keys, vals, kv), atol=1e-5)
    # kv == 0 is plain causal; several equal rows in one call
    q2 = torch.randn(2 * 4, h, d)
    kc2, vc2 = torch.randn(2, hk, 4, d), torch.randn(2, hk, 4, d)
    got2 = K.prefill_attention(q2, kc2, vc2, [1, 0], 0)
    for r, slot in enumerate((1, 0)):
        want = _naive_attention(q2[4 * r: 4 * r + 4], kc2[slot].transpose(0, 1), vc2[slot].transpose(0, 1), 0)
        assert torch.allclose(got2[4 * r: 4 * r + 4], want, atol=1e-5)


def test_decode_attention_masks_each_rows_own_context():
    h, hk, d = 4, 1, 8
    kc, vc = torch.randn(4, hk, 10, d), torch.randn(4, hk, 10, d)
    q = torch.randn(2, h, d)
    lens = torch.tensor([3, 7])
    got = K.decode_attention(q, kc, vc, torch.tensor([3, 1]), lens, 7)
    for r, (slot, n) in enumerate(((3, 3), (1, 7))):
        want = _naive_attention(q[r: r + 1], kc[slot, :, :n].transpose(0, 1), vc[slot, :, :n].transpose(0, 1), n - 1)
        assert torch.allclose(got[r: r + 1], want, atol=1e-5)


def test_silu_and_mul():
    x = torch.randn(3, 10)
    assert torch.allclose(K.silu_and_mul(x.clone()), F.silu(x[:, :5]) * x[:, 5:])


def test_bucket_is_monotone_bounded_and_exact_when_small():
    assert [K.bucket(n) for n in range(1, 17)] == list(range(1, 17))
    prev = 0
    for n in range(1, 5000):
        b = K.bucket(n)
        assert n <= b <= n * (1 + 1 / 16) and b >= prev and K.bucket(b) == b
        prev = b
    assert len({K.bucket(n) for n in range(1, 2561)}) < 160


def test_devices_resolve_or_fail_with_the_option_name():
    assert K.resolve_device("cpu").type == "cpu"
    with pytest.raises(InputError, match="--device"):
        K.resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="CUDA"):
            K.resolve_device("cuda:0")


def test_kernel_timer_times_calls_in_place_and_the_peaks_are_positive():
    timer = K.KernelTimer(CPU)
    out = timer("mlp_act", K.silu_and_mul, torch.randn(4, 8))
    timer("mlp_act", K.silu_and_mul, torch.randn(4, 8))
    timer("norms", K.add_rms_norm, torch.randn(2, 8), None, torch.ones(8))
    assert out.shape == (4, 4)
    times = timer.times()
    assert sorted(times) == ["mlp_act", "norms"] and len(times["mlp_act"]) == 2
    assert all(t > 0 for ts in times.values() for t in ts)
    assert K.launch_seconds(CPU, calls=50, rounds=2) > 0
    assert K.copy_bandwidth(CPU, 1 << 20, repeats=2) > 0
    assert K.peak_gemm_flops(CPU, torch.bfloat16, [64], repeats=2) > 0
    assert K.keep_heap() in (True, False)
    assert "torch" in K.software_versions(CPU) and K.device_name(CPU)
