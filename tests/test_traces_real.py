"""The real public traces in ../shared/traces: what we read equals what pandas reads directly.

Skipped when the folder is absent (it lives outside the repository).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from batchsim.workloads import WorkloadConfig, build_workload

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
AZURE = "azure2023_AzureLLMInferenceTrace_code.csv"
MOONCAKE = "mooncake_fast25_synthetic_trace.jsonl"
SHAREGPT = "sarathi_sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


def need(name: str) -> Path:
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return path


def build(**data):
    return build_workload(WorkloadConfig.model_validate(data), np.random.default_rng(0), TRACES)


def test_azure_code_trace():
    df = pd.read_csv(need(AZURE))
    w = build(trace={"format": "azure", "path": AZURE})
    assert len(w) == len(df) == 8819
    ts = pd.to_datetime(df["TIMESTAMP"])
    assert w.arrival[-1] == pytest.approx((ts.max() - ts.min()).total_seconds(), abs=1e-6)
    assert np.allclose(w.arrival, (ts - ts.iloc[0]).dt.total_seconds().to_numpy(), atol=1e-6)
    assert np.array_equal(w.prompt_tokens, df["ContextTokens"].to_numpy())
    assert np.array_equal(w.output_tokens, df["GeneratedTokens"].to_numpy())
    assert np.percentile(w.prompt_tokens, [50, 90, 99]).round().tolist() == [1469, 5188, 7436]


def test_azure_window_and_speedup():
    df = pd.read_csv(need(AZURE))
    rel = (pd.to_datetime(df["TIMESTAMP"]) - pd.to_datetime(df["TIMESTAMP"]).iloc[0]).dt.total_seconds()
    w = build(trace={"format": "azure", "path": AZURE, "start_s": 600, "end_s": 1200, "speedup": 4})
    inside = rel[(rel >= 600) & (rel < 1200)]
    assert len(w) == len(inside)
    assert w.arrival[-1] == pytest.approx((inside.iloc[-1] - inside.iloc[0]) / 4, abs=1e-6)


def test_mooncake_trace():
    df = pd.read_json(need(MOONCAKE), lines=True)
    w = build(trace={"format": "mooncake", "path": MOONCAKE})
    assert len(w) == len(df) == 3993
    assert np.allclose(w.arrival, (df["timestamp"] - df["timestamp"].iloc[0]).to_numpy() / 1000.0)
    assert w.arrival[-1] == pytest.approx((df["timestamp"].max() - df["timestamp"].min()) / 1000.0)
    assert np.array_equal(w.prompt_tokens, np.maximum(df["input_length"].to_numpy(), 1))
    assert np.array_equal(w.output_tokens, np.maximum(df["output_length"].to_numpy(), 1))
    assert w.prefix_hashes == tuple(tuple(h) for h in df["hash_ids"])
    assert w.prefix_block_tokens == 512
    # every prompt fits in its blocks
    assert all(p <= 512 * len(h) for p, h in zip(w.prompt_tokens.tolist(), w.prefix_hashes))


def test_sharegpt_lengths_replayed_with_poisson():
    df = pd.read_csv(need(SHAREGPT))
    w = build(trace={"format": "lengths", "path": SHAREGPT}, arrival={"process": "poisson", "rate": 5.0})
    assert len(w) == len(df) == 30731
    assert np.array_equal(w.prompt_tokens, df["num_prefill_tokens"].to_numpy())
    assert np.array_equal(w.output_tokens, df["num_decode_tokens"].to_numpy())
    assert np.percentile(w.prompt_tokens, [50, 90, 99]).round().tolist() == [1730, 5696, 7434]
    assert (len(w) - 1) / w.arrival[-1] == pytest.approx(5.0, rel=0.03)


def test_azure_as_empirical_arrivals_keeps_its_burstiness():
    need(AZURE)
    w = build(num_requests=500_000, arrival={"process": "empirical", "rate": 2.0,
                                            "trace": {"format": "azure", "path": AZURE}})
    gaps = np.diff(w.arrival)
    assert gaps.std() / gaps.mean() > 8  # the trace's inter-arrival CV is about 13
    # heavy-tailed gaps: the rate estimate's sd is about 13 / sqrt(500k) = 2%
    assert (len(w) - 1) / w.arrival[-1] == pytest.approx(2.0, rel=0.08)
