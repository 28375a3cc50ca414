"""Fuzzing trace rows: every file is a clean InputError or a valid workload (and a conserved run).

Hypothesis writes trace files row by row with malformed, extreme and
adversarial cells (huge, negative, fractional, NaN/inf, empty, wrong types,
nested JSON, stray separators and quotes, control characters), in every
format, with random replay options, then reads them through
``workloads.build_workload``. A file that loads must give a workload that
satisfies the contract (sorted finite arrivals from 0, lengths in range);
small ones are also simulated end to end and checked for conservation.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
import warnings
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from batchsim.sim.errors import InputError
from batchsim.workloads import WorkloadConfig, build_workload
from batchsim.workloads.config import MAX_TOKENS
from tests.test_overload import run

NUMBERS = st.one_of(
    st.integers(0, 5000), st.integers(0, 5000), st.integers(),
    st.sampled_from([0, -1, 1, 2**40, 2**40 + 1, 2**53 + 1, 2**63, 2**64, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.5, 12.0, -0.0, 1e308, 5e-324, 1e-300]),
)
TEXT = st.one_of(
    st.sampled_from(["", " ", "abc", "1e3", "0x10", " 5 ", "5.0", "NaN", "nan", "inf", "-inf", "1_000",
                     "+5", "\u0663", "1,5", '"7"', "5\n6", "\x00", "\ufeff3", "2023-11-16 18:17:03.9799600",
                     "2024-05-10 00:00:00.009930+00:00", "9999-12-31T23:59:59", "0001-01-01", "yesterday"]),
    st.text(max_size=8),
)
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
                       lambda inner: st.one_of(st.lists(inner, max_size=3),
                                               st.dictionaries(st.text(max_size=3), inner, max_size=2)),
                       max_leaves=4)
CELL = st.one_of(NUMBERS, NUMBERS, TEXT)
LENS = st.one_of(st.integers(0, 3000), st.integers(0, 3000), st.integers(0, 3000), JSONISH)

# More examples for a bug hunt: FUZZ_EXAMPLES=5000 pytest tests/test_fuzz_traces.py
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))

FORMATS = {  # format: (suffix, columns)
    "csv": (".csv", ["arrival", "prompt_tokens", "output_tokens"]),
    "jsonl": (".jsonl", ["arrival", "prompt_tokens", "output_tokens"]),
    "lengths": (".csv", ["num_prefill_tokens", "num_decode_tokens"]),
    "azure": (".csv", ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]),
    "burstgpt": (".csv", ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]),
    "mooncake": (".jsonl", ["timestamp", "input_length", "output_length", "hash_ids"]),
}

OPTIONS = st.fixed_dictionaries({}, optional={
    "start_s": st.sampled_from([0.0, 0.5, 1e300]),
    "end_s": st.sampled_from([1e-9, 2.0, 1e300]),
    "speedup": st.sampled_from([1e-320, 1e-6, 0.5, 3.0, 1e300]),
    "keep_time": st.booleans(),
    "sample": st.sampled_from([1e-9, 0.5, 1.0]),
    "max_requests": st.sampled_from([0, 1, 3]),
    "min_tokens": st.sampled_from([1, 100, 2**40]),
})


def _cell_text(v) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return str(v)


@st.composite
def trace_files(draw):
    """(format, file bytes, options) for one adversarial trace."""
    fmt = draw(st.sampled_from(sorted(FORMATS)))
    suffix, cols = FORMATS[fmt]
    if draw(st.integers(0, 9)) == 0:  # a wrong, missing or extra column
        cols = draw(st.permutations(cols + ["extra"]))[: draw(st.integers(1, len(cols) + 1))]
    good = {c: st.integers(0, 3000) for c in cols}
    good.update({c: st.floats(0, 100) for c in cols if c.lower() in ("arrival", "timestamp")})
    good.update({"TIMESTAMP": st.just("2023-11-16 18:17:03.9799600"), "Model": st.sampled_from(["ChatGPT", "GPT-4"]),
                 "Log Type": st.just("Conversation log"), "hash_ids": st.lists(st.integers(0, 9), max_size=3)})
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        row = {}
        for c in cols:  # mostly sane cells, some adversarial ones
            bad = draw(st.integers(0, 9)) == 0
            row[c] = draw((JSONISH if suffix == ".jsonl" else CELL) if bad else good.get(c, CELL))
        rows.append(row)
    if suffix == ".jsonl":
        lines = [json.dumps(r) for r in rows]
        if draw(st.booleans()):
            lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(
                ["", "{", "[1, 2]", "null", '{"a": 1}', "{" * 2000 + "}" * 2000, "\x00", "not json"])))
        data = "\n".join(lines).encode()
    elif draw(st.booleans()):  # well-quoted CSV
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator=draw(st.sampled_from(["\n", "\r\n"])))
        w.writerow(cols)
        w.writerows([[_cell_text(r[c]) for c in cols] for r in rows])
        data = buf.getvalue().encode()
    else:  # raw CSV: cells with commas, quotes or newlines break the row
        data = ("\n".join([",".join(cols)] + [",".join(_cell_text(r[c]) for c in cols) for r in rows])).encode()
    if draw(st.integers(0, 9)) == 0:
        data = draw(st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe", b"", b"\n\n"])) + data
    return fmt, suffix, data, draw(OPTIONS)


def check_workload(w, options: dict) -> None:
    """The contract build_workload promises for a loaded trace."""
    n = len(w)
    assert len(w.arrival) == len(w.prompt_tokens) == len(w.output_tokens) == n
    assert np.all(np.isfinite(w.arrival)) and np.all(w.arrival >= 0) and np.all(np.diff(w.arrival) >= 0)
    if n and not options.get("keep_time"):
        assert w.arrival[0] == 0.0
    lo = options.get("min_tokens", 1)
    assert np.all(w.prompt_tokens >= lo) and np.all(w.output_tokens >= lo)
    assert np.all(w.prompt_tokens <= max(MAX_TOKENS, lo)) and np.all(w.output_tokens <= max(MAX_TOKENS, lo))


@pytest.mark.timeout(max(240, EXAMPLES))
@settings(max_examples=EXAMPLES, deadline=timedelta(seconds=5),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(trace_files())
def test_trace_files_load_cleanly_or_fail_with_an_input_error(case):
    fmt, suffix, data, options = case
    trace = {"format": fmt, "path": f"t{suffix}", **options}
    if fmt == "lengths" and "start_s" in options:
        trace = {k: v for k, v in trace.items() if k not in ("start_s", "end_s", "speedup", "keep_time")}
    if fmt == "lengths":
        trace = {k: v for k, v in trace.items() if k not in ("end_s", "speedup", "keep_time")}
    workload = {"trace": trace}
    if fmt == "lengths":
        workload.update(arrival={"process": "poisson", "rate": 5.0}, num_requests=4)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / f"t{suffix}").write_bytes(data)
        try:
            cfg = WorkloadConfig.model_validate(workload)
        except Exception as e:  # pydantic's ValidationError: the scenario loader turns it into an InputError
            assert type(e).__name__ == "ValidationError", e
            event("invalid options")
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # unsorted rows warn, then are sorted
                w = build_workload(cfg, np.random.default_rng(0), Path(d))
        except InputError as e:
            assert str(e).strip()
            event("error")
            return
        check_workload(w, options)
        event("loaded")
        if len(w) <= 30 and np.all(w.prompt_tokens + w.output_tokens <= 20_000):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    run({"workload": workload, "horizon_s": 60.0}, Path(d))
                event("simulated")
            except InputError:
                event("error in run")


@pytest.mark.timeout(max(120, EXAMPLES))
@settings(max_examples=EXAMPLES // 2, deadline=timedelta(seconds=5))
@given(st.lists(st.fixed_dictionaries({"input_lens": LENS, "output_lens": LENS}), max_size=5),
       st.fixed_dictionaries({}, optional={"request_rate": st.one_of(st.floats(0.1, 100), st.just("inf"), NUMBERS, TEXT),
                                           "burstiness": st.one_of(st.floats(0.1, 10), JSONISH),
                                           "errors": st.one_of(st.lists(st.sampled_from(["", "boom"]), max_size=5), JSONISH),
                                           "start_times": st.one_of(st.lists(st.floats(0, 10), max_size=5), JSONISH)}))
def test_vllm_bench_files_load_cleanly_or_fail_with_an_input_error(rows, extra):
    doc = {"input_lens": [r["input_lens"] for r in rows], "output_lens": [r["output_lens"] for r in rows], **extra}
    text = json.dumps(doc, allow_nan=True)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "v.json").write_text(text)
        cfg = WorkloadConfig.model_validate({"trace": {"format": "vllm_bench", "path": "v.json"}})
        try:
            w = build_workload(cfg, np.random.default_rng(0), Path(d))
        except InputError as e:
            assert str(e).strip()
            event("error")
            return
        check_workload(w, {})
        event("loaded")
