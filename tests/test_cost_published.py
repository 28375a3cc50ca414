"""Uncalibrated predictions against Vidur's published per-layer GEMM timings (A100, H100)."""

from __future__ import annotations

from batchsim.calibrate.published import MEASURED, predictions


def test_predictions_are_within_25_percent_of_published_measurements():
    rows = predictions()
    assert len(rows) == sum(sum(v is not None for v in t) for table in MEASURED.values() for t in table.values())
    misses = [(r["model"], r["hardware"], r["tokens"], r["op"]) for r in rows if abs(r["error"]) > 0.25]
    # The one miss is a cuBLAS kernel-selection outlier: gate_up at 256 tokens on H100 takes as
    # long as at 512 (0.130 vs 0.134 ms) while 248 and 264 tokens take 0.117 and 0.110 ms.
    assert misses == [("llama-2-7b", "h100-sxm", 256, "mlp_gate_up")]
    assert sum(abs(r["error"]) for r in rows) / len(rows) < 0.08


def test_large_gemms_are_within_20_percent():
    # mlp_down on H100 reaches ~86% of peak against ~75% for the other GEMMs; one peak
    # fraction per device cannot follow both, so it is over-predicted by up to 15%.
    big = [r for r in predictions() if r["tokens"] >= 1024]
    assert max(abs(r["error"]) for r in big) < 0.20
