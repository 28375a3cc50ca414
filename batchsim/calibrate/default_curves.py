"""The efficiency curves of the uncalibrated (datasheet) profiles, and where they come from.

An uncalibrated profile's ``efficiency`` block is generated here from a few
per-device numbers, so that every default has one traceable origin
(docs/cost-model.md cites the measurement behind each number):

- GEMM compute: ``gemm_peak`` (achieved fraction of dense peak on LLM-layer
  shapes at >= 1k tokens) times a tile-utilisation shape ``g(M / ridge)``,
  where ``ridge`` = peak FLOP/s / peak bytes/s of the device. The shape was
  read off Vidur's published A100 Llama-2-7B per-layer timings; the same shape
  in ``M / ridge`` also fits its H100 timings (the knee moves with the ridge).
- Memory (GEMM weights, attention KV, elementwise): a streaming kernel takes
  ``t0 + bytes / (hbm_peak x bandwidth)``, i.e. the fraction of peak bandwidth
  is ``1 / (1/hbm_peak + bandwidth x t0 / bytes)``. ``hbm_peak`` and ``t0``
  were fitted to Vidur's decode-size (M = 1) GEMM timings on A100 and H100.
- Prefill attention: FlashAttention-2 (A100-class) or -3 (Hopper) published
  forward throughput versus sequence length, scaled by ``attn_scale``.

Run ``python -m batchsim.calibrate.default_curves`` to rewrite the ``efficiency`` block
of every datasheet profile after changing a number here; a test checks that
the YAML files and this module agree.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from batchsim.calibrate.hardware import PROFILE_DIR, load_hardware

__all__ = ["DEVICE_PARAMS", "default_efficiency", "gemm_shape", "write_efficiency"]

# g(x): achieved / best GEMM compute fraction at M = x * ridge tokens.
_G_X = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 2.0, 4.0)
_G_Y = (0.094, 0.188, 0.33, 0.52, 0.74, 0.95, 1.0)
_SMALL_SLOPE = _G_Y[0] / _G_X[0]  # g(x) ~ 1.5 x below the table: tile quantisation

# Prefill attention fraction of peak vs prefill tokens (causal, head_dim 128).
_FA2 = ((16, 0.05), (128, 0.25), (512, 0.45), (2048, 0.60), (8192, 0.65), (32768, 0.68))
_FA3 = ((16, 0.05), (128, 0.20), (512, 0.40), (2048, 0.60), (8192, 0.70), (32768, 0.72))

_TOKENS = tuple(2**i for i in range(0, 15))          # 1 .. 16384
_BYTES = tuple(4**i for i in range(6, 18))           # 4 KiB .. 16 GiB

# Per-device inputs. "measured" notes which came from a published measurement
# on that device; the rest are assumptions stated in docs/cost-model.md.
DEVICE_PARAMS: dict[str, dict] = {
    "a100-40gb": dict(gemm_peak=0.69, hbm_peak=0.82, t0_us=5.0, attn="fa2", attn_scale=1.0),
    "a100-80gb": dict(gemm_peak=0.69, hbm_peak=0.82, t0_us=5.0, attn="fa2", attn_scale=1.0),
    "a100-80gb-pcie": dict(gemm_peak=0.66, hbm_peak=0.82, t0_us=5.0, attn="fa2", attn_scale=0.96),
    "h100-sxm": dict(gemm_peak=0.75, hbm_peak=0.92, t0_us=5.0, attn="fa3", attn_scale=1.0),
    "h100-pcie": dict(gemm_peak=0.70, hbm_peak=0.85, t0_us=5.0, attn="fa3", attn_scale=0.93),
    "h200": dict(gemm_peak=0.75, hbm_peak=0.90, t0_us=5.0, attn="fa3", attn_scale=1.0),
    "b200": dict(gemm_peak=0.72, hbm_peak=0.88, t0_us=5.0, attn="fa3", attn_scale=0.96),
    "l4": dict(gemm_peak=0.60, hbm_peak=0.85, t0_us=5.0, attn="fa2", attn_scale=0.87),
    "l40s": dict(gemm_peak=0.65, hbm_peak=0.85, t0_us=5.0, attn="fa2", attn_scale=0.94),
    "mi300x": dict(gemm_peak=0.51, hbm_peak=0.78, t0_us=5.0, attn="fa2", attn_scale=0.70),
}


def gemm_shape(x: float) -> float:
    """Tile-utilisation factor g(x) for M = x * ridge tokens (1 at large M)."""
    if x <= _G_X[0]:
        return _SMALL_SLOPE * x
    if x >= _G_X[-1]:
        return 1.0
    lx = math.log(x)
    for i in range(len(_G_X) - 1):
        a, b = math.log(_G_X[i]), math.log(_G_X[i + 1])
        if a <= lx <= b:
            return _G_Y[i] + (lx - a) / (b - a) * (_G_Y[i + 1] - _G_Y[i])
    raise AssertionError("unreachable")


def _round(v: float) -> float:
    return float(f"{v:.4g}")


def _memory(hbm_peak: float, t0_us: float, bandwidth: float) -> list[list[float]]:
    k = bandwidth * t0_us * 1e-6
    return [[float(b), _round(1.0 / (1.0 / hbm_peak + k / b))] for b in _BYTES]


def default_efficiency(peak_flops: float, bandwidth: float, params: dict) -> dict:
    """The ``efficiency`` block of a datasheet profile (plain data, YAML-ready)."""
    ridge = peak_flops / bandwidth
    e = params["gemm_peak"]
    gemm_c = [[float(m), _round(e * gemm_shape(m / ridge))] for m in _TOKENS]
    table = _FA3 if params["attn"] == "fa3" else _FA2
    attn_c = [[float(t), _round(f * params["attn_scale"])] for t, f in table]
    # NOTE: decode attention and elementwise FLOPs run mostly off the tensor
    # cores; their compute fractions are flat and low on purpose so that they
    # never bind before memory does (their intensity is ~1-8 FLOP/byte).
    return {
        "gemm": {"compute": gemm_c, "memory": _memory(params["hbm_peak"], params["t0_us"], bandwidth)},
        "attention_prefill": {"compute": attn_c,
                              "memory": _memory(params["hbm_peak"], params["t0_us"], bandwidth)},
        "attention_decode": {"compute": [[1.0, 0.2]],
                             "memory": _memory(params["hbm_peak"], 8.0, bandwidth)},
        "elementwise": {"compute": [[1.0, 0.05]], "memory": _memory(0.5, 3.0, bandwidth)},
    }


def write_efficiency(path: Path, block: dict) -> None:
    """Replace the top-level ``efficiency:`` block of a profile YAML in place."""
    lines = Path(path).read_text(encoding="utf-8").splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.startswith("efficiency:"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "#"))
    dumped = yaml.safe_dump({"efficiency": block}, sort_keys=False, default_flow_style=None, width=100)
    Path(path).write_text("".join(lines[:start]) + dumped + "".join(lines[end:]), encoding="utf-8")


def main() -> None:  # pragma: no cover - maintenance entry point
    """Regenerate the efficiency block of every datasheet profile."""
    for name, params in DEVICE_PARAMS.items():
        hw = load_hardware(name)
        block = default_efficiency(hw.peak_flops("bf16"), hw.bandwidth, params)
        write_efficiency(PROFILE_DIR / f"{name}.yaml", block)
        print(f"rewrote {name}")


if __name__ == "__main__":  # pragma: no cover
    main()
