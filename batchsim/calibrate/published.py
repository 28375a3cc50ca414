"""Published per-layer GEMM timings, and the uncalibrated model's predictions of them.

The measurements are Vidur's public operator profiles (Agrawal et al.,
"Vidur: A Large-Scale Simulation Framework for LLM Inference", MLSys 2024),
files ``data/profiling/compute/{a100,h100}/<model>/mlp.csv`` in
https://github.com/microsoft/vidur: median CUDA-event time in milliseconds of
one layer's ``attn_pre_proj`` (fused QKV), ``attn_post_proj`` (O),
``mlp_up_proj`` (fused gate+up) and ``mlp_down_proj`` at tensor-parallel
size 1, fp16, on an A100 80GB SXM and an H100 80GB SXM (DGX nodes).
The A100 Llama-2-7B file is at commit bee57daf, the A100 Llama-3-8B file at
41ab8ab1, the H100 Llama-2-7B file at e26eb8f7.

``python -m batchsim.calibrate.published`` prints the comparison table that
docs/cost-model.md reproduces.
"""

from __future__ import annotations

from batchsim.calibrate.costmodel import RooflineCostModel
from batchsim.calibrate.hardware import load_hardware
from batchsim.calibrate.models import load_model

__all__ = ["MEASURED", "OPS", "predictions", "markdown_table"]

OPS = ("qkv_proj", "o_proj", "mlp_gate_up", "mlp_down")

# (model, hardware) -> tokens -> (qkv_proj, o_proj, mlp_gate_up, mlp_down) in ms; None = not read.
MEASURED: dict[tuple[str, str], dict[int, tuple]] = {
    ("llama-2-7b", "a100-80gb"): {
        1: (0.065, 0.025, 0.116, 0.060), 16: (0.064, 0.026, 0.111, 0.062),
        64: (0.067, 0.027, 0.116, 0.068), 128: (0.0745, 0.032, 0.157, 0.088),
        256: (0.112, 0.052, 0.229, 0.1095), 512: (0.234, 0.088, 0.402, 0.229),
        1024: (0.475, 0.176, 0.877, 0.431), 2048: (0.979, 0.301, 1.694, 0.851),
        4096: (1.911, 0.611, 3.3655, 1.604),
    },
    ("llama-3-8b", "a100-80gb"): {
        1: (0.033, 0.025, 0.142, 0.076), 16: (0.034, 0.026, 0.1515, 0.079),
        64: (None, 0.027, 0.173, 0.088), 128: (0.043, 0.032, 0.191, 0.111),
        256: (0.075, 0.053, 0.291, 0.135), 1024: (0.246, 0.181, 1.172, 0.576),
        2048: (0.467, 0.308, 2.2485, 1.049),
    },
    ("llama-2-7b", "h100-sxm"): {
        1: (0.038, 0.016, 0.064, 0.038), 16: (0.041, 0.016, 0.0665, 0.037),
        64: (0.040, 0.016, 0.066, 0.040), 128: (0.041, 0.020, 0.071, 0.048),
        256: (0.052, 0.022, 0.130, 0.056), 512: (0.090, 0.029, 0.134, 0.0755),
        1024: (0.151, 0.049, 0.256, 0.109), 2048: (0.281, 0.096, 0.492, 0.218),
        4096: (0.584, 0.193, 0.987, 0.441),
    },
}


def _shapes(cm: RooflineCostModel) -> dict[str, tuple[int, int]]:
    s, d = cm.shard, cm.model.hidden_size
    return {"qkv_proj": (d, s.qkv_width), "o_proj": (s.heads * cm.model.head_dim, d),
            "mlp_gate_up": (d, 2 * s.mlp_width), "mlp_down": (s.mlp_width, d)}


def predictions() -> list[dict]:
    """One row per (model, hardware, tokens, op): measured and predicted ms, error."""
    rows = []
    for (model, hw), table in MEASURED.items():
        cm = RooflineCostModel(load_model(model), load_hardware(hw), dtype="fp16")
        shapes = _shapes(cm)
        for tokens, values in table.items():
            for op, measured in zip(OPS, values):
                if measured is None:
                    continue
                k, n = shapes[op]
                pred = cm.gemm_seconds(tokens, k, n) * 1e3
                rows.append(dict(model=model, hardware=hw, tokens=tokens, op=op, measured_ms=measured,
                                 predicted_ms=pred, error=pred / measured - 1.0))
    return rows


def markdown_table() -> str:
    """The predicted-vs-measured table, one line per (model, hardware, tokens)."""
    lines = ["| model | GPU | tokens | " + " | ".join(f"{op} meas / pred (err)" for op in OPS) + " |",
             "|---|---|---:|" + "---|" * len(OPS)]
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in predictions():
        by_key.setdefault((r["model"], r["hardware"], r["tokens"]), {})[r["op"]] = r
    for (model, hw, tokens), ops in by_key.items():
        cells = []
        for op in OPS:
            r = ops.get(op)
            cells.append("n/a" if r is None else
                         f"{r['measured_ms']:.3f} / {r['predicted_ms']:.3f} ({r['error']:+.0%})")
        lines.append(f"| {model} | {hw} | {tokens} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    rows = predictions()
    print(markdown_table())
    within = sum(abs(r["error"]) <= 0.25 for r in rows)
    print(f"\n{within}/{len(rows)} within 25%; mean |error| "
          f"{sum(abs(r['error']) for r in rows) / len(rows):.1%}")
