"""Reading and writing real benchmark results: vllm bench serve, SGLang bench_serving, GuideLLM, genai-perf."""

from __future__ import annotations

import dataclasses

import json

import numpy as np
import pandas as pd
import pytest

from batchsim.calibrate.bench import (
    BenchRun,
    read_bench,
    run_from_records,
    write_genai_perf,
    write_guidellm,
    write_sglang_bench,
    write_vllm_bench,
)
from batchsim.sim.errors import InputError


def make_run(label: str, mode: str, rate: float | None = None, concurrency: int | None = None, *, n: int = 6,
             failed: int = 0, seed: int = 0, model: str | None = "meta-llama/Llama-3.1-8B-Instruct") -> BenchRun:
    """A run with one gap per output token after the first (output 1 -> no gaps)."""
    rng = np.random.default_rng(seed)
    out = rng.integers(1, 9, n)
    out[0] = 1
    lens = out - 1
    gaps = rng.uniform(0.005, 0.05, int(lens.sum()))
    off = np.concatenate([[0], np.cumsum(lens)])
    ttft = rng.uniform(0.02, 0.5, n)
    latency = ttft + np.array([gaps[off[i]:off[i + 1]].sum() for i in range(n)]) + rng.uniform(0, 1e-3, n)
    start = np.concatenate([[0.0], np.cumsum(rng.exponential(0.25, n - 1))])
    return BenchRun("mem", "vllm", label, model, mode, rate, concurrency, start, rng.integers(10, 500, n), out,
                    ttft, latency, gaps, off.astype(np.int64), failed)


def assert_columns(got: BenchRun, want: BenchRun, *, atol: float = 1e-12, start_atol: float | None = None) -> None:
    assert len(got) == len(want)
    np.testing.assert_array_equal(got.input_tokens, want.input_tokens)
    np.testing.assert_array_equal(got.output_tokens, want.output_tokens)
    np.testing.assert_allclose(got.start, want.start, rtol=0, atol=start_atol if start_atol is not None else atol)
    np.testing.assert_allclose(got.ttft, want.ttft, rtol=0, atol=atol)
    np.testing.assert_allclose(got.latency, want.latency, rtol=0, atol=atol)
    assert got.start.dtype == np.float64 and got.input_tokens.dtype == np.int64
    assert got.itl_offsets.dtype == np.int64


# ----------------------------------------------------------------------------- vllm


@pytest.mark.parametrize(("mode", "rate", "conc", "label"), [
    ("rate", 4.0, None, "rate=4.0"),
    ("concurrency", None, 16, "concurrency=16"),
    ("trace", None, None, "rate=inf"),
    ("rate", 2.5, 8, "rate=2.5"),
])
def test_vllm_round_trip(tmp_path, mode, rate, conc, label):
    run = make_run(label, mode, rate, conc, failed=2)
    path = tmp_path / "vllm.json"
    runs = read_bench(write_vllm_bench(path, run))
    assert len(runs) == 1
    got = runs[0]
    assert (got.format, got.label, got.mode, got.rate, got.concurrency) == ("vllm", label, mode, rate, conc)
    assert got.model == run.model and got.source == str(path)
    assert got.failed == 2
    assert_columns(got, run, atol=1e-9)
    np.testing.assert_array_equal(got.itl_offsets, run.itl_offsets)
    np.testing.assert_allclose(got.itl_gaps, run.itl_gaps, rtol=0, atol=1e-15)
    data = json.loads(path.read_text())
    assert data["request_rate"] == (rate if mode == "rate" else "inf")
    assert data["median_ttft_ms"] == pytest.approx(np.median(run.ttft) * 1000)
    assert data["completed"] == len(run) and data["failed"] == 2 and data["num_prompts"] == len(run) + 2


def test_vllm_failed_dropped_and_sorted(tmp_path):
    run = make_run("rate=4.0", "rate", 4.0)
    path = write_vllm_bench(tmp_path / "v.json", run)
    data = json.loads(path.read_text())
    data["errors"][1] = "ClientConnectorError: connection reset"  # failed with an error text
    data["ttfts"][3], data["output_lens"][3], data["itls"][3] = 0.0, 0, []  # failed as vLLM records it, no text
    order = [5, 4, 3, 2, 1, 0]  # the file need not be in send order
    for key in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors"):
        data[key] = [data[key][i] for i in order]
    path.write_text(json.dumps(data))
    got = read_bench(path)[0]
    keep = [0, 2, 4, 5]
    assert got.failed == 2 and len(got) == 4
    np.testing.assert_allclose(got.start, run.start[keep] - run.start[0], atol=1e-9)
    np.testing.assert_array_equal(got.output_tokens, run.output_tokens[keep])
    for k, i in enumerate(keep):
        np.testing.assert_allclose(got.gaps(k), run.gaps(i))


def test_vllm_old_file_without_latencies_and_start_times(tmp_path):
    run = make_run("concurrency=4", "concurrency", None, 4)
    path = write_vllm_bench(tmp_path / "old.json", run)
    data = json.loads(path.read_text())
    del data["latencies"], data["start_times"]
    path.write_text(json.dumps(data))
    got = read_bench(path)[0]
    assert got.mode == "concurrency" and got.concurrency == 4
    np.testing.assert_array_equal(got.start, np.zeros(len(run)))
    np.testing.assert_allclose(got.latency, [run.ttft[i] + run.gaps(i).sum() for i in range(len(run))])

    data["max_concurrency"] = None  # at an infinite rate every request was sent at once
    path.write_text(json.dumps(data))
    got = read_bench(path)[0]
    assert got.mode == "trace" and got.label == "rate=inf"
    np.testing.assert_array_equal(got.start, np.zeros(len(run)))
    data["request_rate"] = 4.0  # a finite-rate open loop without send times cannot be replayed
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == f"{path}: start_times"
    assert "cannot be replayed" in e.value.message


# ----------------------------------------------------------------------------- sglang


def _at_once(run: BenchRun) -> BenchRun:
    """``run`` with every request sent at t = 0 (a run at an infinite rate)."""
    return BenchRun(run.source, run.format, run.label, run.model, run.mode, run.rate, run.concurrency,
                    np.zeros(len(run)), run.input_tokens, run.output_tokens, run.ttft, run.latency, run.itl_gaps,
                    run.itl_offsets, run.failed)


def test_sglang_round_trip_one_line_per_run(tmp_path):
    closed = make_run("concurrency=16", "concurrency", None, 16, failed=2, n=9)
    burst = _at_once(make_run("rate=inf", "trace", seed=1, n=7, model=None))
    path = write_sglang_bench(tmp_path / "sglang.jsonl", [closed, burst])
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and "Infinity" in lines[0]  # (json.dumps(float("inf")), as SGLang writes it)
    got = read_bench(path)
    assert [(r.format, r.label, r.mode, r.concurrency) for r in got] == [
        ("sglang", "concurrency=16", "concurrency", 16), ("sglang", "rate=inf", "trace", None)]
    assert got[0].failed == 2 and got[0].model == closed.model and got[1].model is None
    for g, want in zip(got, (closed, burst)):
        np.testing.assert_array_equal(g.start, np.zeros(len(want)))  # SGLang saves no send times
        np.testing.assert_array_equal(g.input_tokens, want.input_tokens)
        np.testing.assert_array_equal(g.itl_offsets, want.itl_offsets)
        np.testing.assert_allclose(g.itl_gaps, want.itl_gaps, rtol=0, atol=1e-15)
        np.testing.assert_allclose(g.ttft, want.ttft, rtol=0, atol=1e-15)
        # no latencies either: the end is the first token plus the gaps
        np.testing.assert_allclose(g.latency, [want.ttft[i] + want.gaps(i).sum() for i in range(len(want))])
    single = tmp_path / "one.jsonl"  # one run: a single JSON object
    single.write_text(lines[0] + "\n")
    assert [r.label for r in read_bench(single)] == ["concurrency=16"]


def test_vllm_append_result_lines_are_runs(tmp_path):
    # vllm bench serve --append-result: a newline, then each run's JSON, in one file
    a, b = make_run("rate=4.0", "rate", 4.0), make_run("concurrency=8", "concurrency", None, 8, seed=2)
    pa, pb = write_vllm_bench(tmp_path / "a.json", a), write_vllm_bench(tmp_path / "b.json", b)
    path = tmp_path / "appended.json"
    path.write_text(pa.read_text() + "\n" + pb.read_text())
    got = read_bench(path)
    assert [(r.format, r.label) for r in got] == [("vllm", "rate=4.0"), ("vllm", "concurrency=8")]
    assert_columns(got[0], a, atol=1e-9)


def test_sglang_runs_whose_arrivals_are_not_in_the_file_are_named(tmp_path):
    path = write_sglang_bench(tmp_path / "s.jsonl", [make_run("concurrency=4", "concurrency", None, 4)])
    data = json.loads(path.read_text())
    for rate, text in ((4.0, "is 4.0: SGLang saves no send times"), ("trace", 'is "trace"')):
        data["request_rate"], data["max_concurrency"] = rate, None
        path.write_text(json.dumps(data) + "\n")
        with pytest.raises(InputError) as e:
            read_bench(path)
        assert e.value.where == f"{path}: request_rate" and text in e.value.message
        assert "--max-concurrency" in e.value.message
    with pytest.raises(ValueError):
        write_sglang_bench(tmp_path / "r.jsonl", [make_run("rate=4.0", "rate", 4.0)])


def test_sglang_bad_lines_are_named_by_line(tmp_path):
    good = write_sglang_bench(tmp_path / "s.jsonl", [make_run("concurrency=4", "concurrency", None, 4)])
    first = good.read_text().splitlines()[0]
    for second, text in (("{not json", "not JSON"), ("[1, 2]", "is a JSON list"),
                         ('{"backend": "x"}', "an object of neither tool")):
        path = tmp_path / "bad.jsonl"
        path.write_text(first + "\n\n" + second + "\n")
        with pytest.raises(InputError) as e:
            read_bench(path)
        assert e.value.where == f"{path}: line 3" and text in e.value.message
    data = json.loads(first)
    data["ttfts"][2] = "fast"
    path.write_text(first + "\n" + json.dumps(data) + "\n")
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == f"{path}: line 2, field 'ttfts'" and "'fast'" in e.value.message
    del data["itls"]
    path.write_text(json.dumps(data) + "\n" + first + "\n")
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == f"{path}: line 1, field 'itls'" and "--output-details" in e.value.message


def test_vllm_without_save_detailed(tmp_path):
    path = write_vllm_bench(tmp_path / "summary.json", make_run("rate=1.0", "rate", 1.0), save_detailed=False)
    assert "ttfts" not in json.loads(path.read_text())
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert str(path) in str(e.value) and e.value.where == f"{path}: input_lens"
    assert "only summary keys" in e.value.message and "--save-detailed" in e.value.message


def _edit(path, **changes):
    data = json.loads(path.read_text())
    for key, fn in changes.items():
        data[key] = fn(data[key])
    path.write_text(json.dumps(data))


def test_vllm_unequal_lengths(tmp_path):
    path = write_vllm_bench(tmp_path / "v.json", make_run("rate=4.0", "rate", 4.0))
    _edit(path, ttfts=lambda v: v[:-1])
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == f"{path}: ttfts"
    assert "has 5 entries; expected 6" in e.value.message


@pytest.mark.parametrize(("key", "value", "text"), [
    ("ttfts", -0.5, "entry 2 is -0.5 (negative)"),
    ("ttfts", "0.1", "entry 2 is '0.1'"),
    ("latencies", None, "entry 2 is missing (null)"),
    ("output_lens", 2.5, "entry 2 is 2.5"),
])
def test_vllm_bad_value(tmp_path, key, value, text):
    path = write_vllm_bench(tmp_path / "v.json", make_run("rate=4.0", "rate", 4.0))
    _edit(path, **{key: lambda v: v[:2] + [value] + v[3:]})
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == f"{path}: {key}"
    assert text in e.value.message


def test_vllm_bad_gap_names_request_and_gap(tmp_path):
    path = write_vllm_bench(tmp_path / "v.json", make_run("rate=4.0", "rate", 4.0))
    data = json.loads(path.read_text())
    i = next(i for i, g in enumerate(data["itls"]) if len(g) >= 2)
    data["itls"][i][1] = float("nan")
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == f"{path}: itls"
    assert f"entry {i} gap 1 is nan (not finite)" in e.value.message


def test_vllm_latency_shorter_than_ttft(tmp_path):
    path = write_vllm_bench(tmp_path / "v.json", make_run("rate=4.0", "rate", 4.0))
    _edit(path, latencies=lambda v: [0.001] + v[1:])
    with pytest.raises(InputError, match="request 0: latency 0.001 s is shorter than its ttft"):
        read_bench(path)


# ----------------------------------------------------------------------------- GuideLLM


def test_guidellm_round_trip_many_benchmarks(tmp_path):
    runs = [make_run("poisson@4.0", "rate", 4.0, failed=1, seed=1),
            make_run("concurrent@16", "concurrency", None, 16, seed=2),
            make_run("synchronous", "concurrency", None, 1, seed=3),
            make_run("throughput", "trace", seed=4),
            make_run("throughput@64", "concurrency", None, 64, seed=5),
            make_run("constant@2.0", "rate", 2.0, 32, failed=3, seed=6)]
    path = write_guidellm(tmp_path / "benchmarks.json", runs)
    data = json.loads(path.read_text())
    assert data["metadata"]["version"] == 2 and len(data["benchmarks"]) == 6
    assert [b["config"]["strategy"]["type_"] for b in data["benchmarks"]] == [
        "poisson", "concurrent", "synchronous", "throughput", "throughput", "constant"]
    got = read_bench(path)
    assert [(r.label, r.mode, r.rate, r.concurrency, r.failed) for r in got] == [
        ("poisson@4.0", "rate", 4.0, None, 1), ("concurrent@16", "concurrency", None, 16, 0),
        ("synchronous", "concurrency", None, 1, 0), ("throughput", "trace", None, None, 0),
        ("throughput@64", "concurrency", None, 64, 0), ("constant@2.0", "rate", 2.0, 32, 3)]
    for g, r in zip(got, runs, strict=True):
        assert g.format == "guidellm" and g.model == r.model
        assert_columns(g, r, atol=1e-12, start_atol=1e-6)  # epoch-second starts: float64 near 1.7e9
        np.testing.assert_array_equal(np.diff(g.itl_offsets), np.maximum(r.output_tokens - 1, 0))
        for i in range(len(r)):  # GuideLLM keeps one mean gap per request
            if len(r.gaps(i)):
                np.testing.assert_allclose(g.gaps(i), np.full(len(r.gaps(i)), r.gaps(i).mean()))


def test_guidellm_errored_and_incomplete_counted(tmp_path):
    path = write_guidellm(tmp_path / "b.json", [make_run("poisson@1.0", "rate", 1.0, failed=2)])
    data = json.loads(path.read_text())
    reqs = data["benchmarks"][0]["requests"]
    reqs["incomplete"] = [reqs["successful"].pop()]
    totals = data["benchmarks"][0]["metrics"]["request_totals"]
    totals["successful"] -= 1
    totals["incomplete"] += 1
    path.write_text(json.dumps(data))
    got = read_bench(path)[0]
    assert len(got) == 5 and got.failed == 3


def test_a_guidellm_report_that_kept_a_sample_of_its_requests_is_refused(tmp_path):
    path = write_guidellm(tmp_path / "b.json", [make_run("poisson@1.0", "rate", 1.0)])
    data = json.loads(path.read_text())
    del data["benchmarks"][0]["requests"]["successful"][2:]  # --sample-requests 2: totals still say 6
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == f"{path}: benchmarks[0].requests.successful"
    assert "holds 2 of the benchmark's 6 successful requests" in e.value.message


def test_guidellm_bad_values(tmp_path):
    path = write_guidellm(tmp_path / "b.json", [make_run("poisson@1.0", "rate", 1.0), make_run("c", "concurrency",
                                                                                              None, 2)])
    data = json.loads(path.read_text())
    data["benchmarks"][1]["requests"]["successful"][3]["time_to_first_token_ms"] = -1.0
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == f"{path}: benchmarks[1].requests.successful[].time_to_first_token_ms"
    assert "request 3 is -1.0 (negative)" in e.value.message

    data["benchmarks"][1]["config"]["strategy"] = {"type_": "sweep"}
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == f"{path}: benchmarks[1].config.strategy.type_" and "'sweep'" in e.value.message


# ----------------------------------------------------------------------------- genai-perf


def test_genai_perf_round_trip_many_experiments(tmp_path):
    runs = [make_run("concurrency=8", "concurrency", None, 8, failed=2, seed=7),
            make_run("rate=3.0", "rate", 3.0, seed=8)]
    path = write_genai_perf(tmp_path / "profile_export.json", runs)
    got = read_bench(path)
    assert [(r.format, r.label, r.mode, r.rate, r.concurrency, r.failed) for r in got] == [
        ("genai-perf", "concurrency=8", "concurrency", None, 8, 2), ("genai-perf", "rate=3.0", "rate", 3.0, None, 0)]
    for g, r in zip(got, runs, strict=True):
        assert g.model == r.model
        # genai-perf's latency ends at the last response with text (its parser drops usage and [DONE])
        last = r.ttft + np.array([r.gaps(i).sum() for i in range(len(r))])
        assert_columns(g, dataclasses.replace(r, latency=last), atol=2e-9)
        np.testing.assert_array_equal(g.itl_offsets, r.itl_offsets)
        np.testing.assert_allclose(g.itl_gaps, r.itl_gaps, rtol=0, atol=1.01e-9)


def test_genai_perf_trace_run_not_writable(tmp_path):
    with pytest.raises(ValueError, match="trace"):
        write_genai_perf(tmp_path / "p.json", [make_run("rate=inf", "trace")])


def _sse(obj) -> dict:
    return {"response": "data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n"}


def test_genai_perf_hand_written_file(tmp_path):
    """Chunks carrying several tokens, the usage chunk and [DONE] are not gaps; an error response fails."""
    tok = {"choices": [{"index": 0, "delta": {"content": "ab"}}], "usage": None}
    usage = {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}}
    ms = 1_000_000
    ok = {"timestamp": 10 * ms, "request_inputs": {"payload": json.dumps({"model": "m1", "stream": True})},
          "response_timestamps": [30 * ms, 35 * ms, 45 * ms, 46 * ms, 47 * ms],
          "response_outputs": [_sse(tok), _sse(tok), _sse(tok), _sse(usage), _sse("[DONE]")]}
    early = dict(ok, timestamp=0)
    err = {"timestamp": 5 * ms, "request_inputs": {"payload": "{}"}, "response_timestamps": [6 * ms],
           "response_outputs": [_sse({"error": {"message": "overloaded"}})]}
    lost = {"timestamp": 7 * ms, "request_inputs": {"payload": "{}"}, "response_timestamps": [],
            "response_outputs": []}
    data = {"service_kind": "openai", "endpoint": "v1/chat/completions",
            "experiments": [{"experiment": {"mode": "request_rate", "value": 2},
                             "requests": [ok, err, early, lost]}]}
    path = tmp_path / "export.json"
    path.write_text(json.dumps(data))
    (run,) = read_bench(path)
    assert (run.mode, run.rate, run.label, run.model, run.failed) == ("rate", 2.0, "rate=2.0", "m1", 2)
    np.testing.assert_allclose(run.start, [0.0, 0.010])
    np.testing.assert_array_equal(run.input_tokens, [12, 12])
    np.testing.assert_array_equal(run.output_tokens, [5, 5])  # completion_tokens, not the 3 chunks
    np.testing.assert_allclose(run.ttft, [0.030, 0.020])
    np.testing.assert_allclose(run.latency, [0.045, 0.035])  # the last chunk with text, as genai-perf
    np.testing.assert_allclose(run.itl_gaps, [0.005, 0.010, 0.005, 0.010])
    np.testing.assert_array_equal(run.itl_offsets, [0, 2, 4])


def test_genai_perf_without_usage(tmp_path):
    path = write_genai_perf(tmp_path / "p.json", [make_run("concurrency=2", "concurrency", None, 2)])
    data = json.loads(path.read_text())
    for r in data["experiments"][0]["requests"]:
        r["response_outputs"] = [o for o in r["response_outputs"] if '"usage": {' not in o["response"]]
        r["response_timestamps"] = r["response_timestamps"][:len(r["response_outputs"])]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == f"{path}: experiments[0].requests[].response_outputs"
    assert "token counts are missing" in e.value.message
    assert '"stream_options": {"include_usage": true}' in e.value.message


def test_genai_perf_bad_timestamps(tmp_path):
    path = write_genai_perf(tmp_path / "p.json", [make_run("concurrency=2", "concurrency", None, 2)])
    data = json.loads(path.read_text())
    r = data["experiments"][0]["requests"][1]
    r["response_timestamps"][1] = r["timestamp"] - 1
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == f"{path}: experiments[0].requests[1].response_timestamps"
    assert "entry 1" in e.value.message and "non-decreasing" in e.value.message


# ----------------------------------------------------------------------------- any file


def test_not_json(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text('{"ttfts": [0.1,')
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == str(path) and e.value.message.startswith("not JSON")


def test_unknown_format(tmp_path):
    path = tmp_path / "vllm_results.json"  # the name does not decide the format
    path.write_text(json.dumps({"results": [], "version": 3}))
    with pytest.raises(InputError) as e:
        read_bench(path)
    assert e.value.where == str(path)
    assert "unknown format" in e.value.message and "results, version" in e.value.message


def test_missing_file_and_not_an_object(tmp_path):
    with pytest.raises(InputError, match="cannot be read"):
        read_bench(tmp_path / "absent.json")
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(InputError, match="not an object"):
        read_bench(path)


def test_percentiles_hand_computed():
    gaps = np.array([0.01, 0.02, 0.03, 0.04, 0.05])
    run = BenchRun("mem", "vllm", "rate=1.0", None, "rate", 1.0, None, np.array([0.0, 1.0, 2.0, 3.0]),
                   np.array([5, 5, 5, 5]), np.array([1, 3, 4, 2]), np.array([0.1, 0.2, 0.3, 0.4]),
                   np.array([0.1, 0.5, 0.9, 0.7]), gaps, np.array([0, 0, 2, 4, 5]), 0)
    np.testing.assert_allclose(run.tpot, [np.nan, 0.15, 0.2, 0.3])
    assert run.percentiles("ttft") == pytest.approx({"p50": 0.25, "p99": 0.397})
    assert run.percentiles("e2el", (0, 50, 100)) == pytest.approx({"p0": 0.1, "p50": 0.6, "p100": 0.9})
    assert run.percentiles("tpot", (50,)) == pytest.approx({"p50": 0.2})  # the NaN one-token request left out
    assert run.percentiles("itl", (50, 90)) == pytest.approx({"p50": 0.03, "p90": 0.046})
    with pytest.raises(ValueError, match="unknown metric"):
        run.percentiles("tbt")


def test_run_from_records():
    requests = pd.DataFrame({
        "rid": [10, 11, 12, 13],
        "status": ["completed", "completed", "rejected", "completed"],
        "arrival": [2.0, 1.5, 1.7, 3.0],
        "prompt_tokens": [100, 200, 300, 400],
        "output_tokens": [3, 2, 5, 1],
        "first_token": [2.1, 1.8, np.nan, 3.05],
        "completion": [2.3, 1.9, np.nan, 3.05],
        "ttft": [0.1, 0.3, np.nan, 0.05],
        "e2el": [0.3, 0.4, np.nan, 0.05],
    })
    itl = pd.DataFrame({"rid": [10, 11, 10, 12, 12], "gap": [0.08, 0.1, 0.12, 0.5, 0.6]})
    run = run_from_records(requests, itl, label="rate=2.0", mode="rate", rate=2.0, model="m")
    assert (run.label, run.mode, run.rate, run.concurrency, run.model, run.failed) == ("rate=2.0", "rate", 2.0, None,
                                                                                        "m", 1)
    assert len(run) == 3
    np.testing.assert_allclose(run.start, [0.0, 0.5, 1.5])  # rid 11, 10, 13 by arrival
    np.testing.assert_array_equal(run.input_tokens, [200, 100, 400])
    np.testing.assert_array_equal(run.output_tokens, [2, 3, 1])
    np.testing.assert_allclose(run.ttft, [0.3, 0.1, 0.05])
    np.testing.assert_allclose(run.latency, [0.4, 0.3, 0.05])
    np.testing.assert_array_equal(run.itl_offsets, [0, 1, 3, 3])
    np.testing.assert_allclose(run.itl_gaps, [0.1, 0.08, 0.12])
    # and it exports like any other run
    np.testing.assert_allclose(run.tpot, [0.1, 0.1, np.nan])


def test_genai_perf_chunks_without_text_are_not_tokens(tmp_path):
    """vLLM's role chunk and a final chunk with only finish_reason carry no text: genai-perf drops them
    (``_preprocess_response``) before it takes TTFT, the gaps and the latency, and so does the reader."""
    ms = 1_000_000
    role = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    tok = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "a"}}]}
    fin = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}
    req = {"timestamp": 10 * ms, "request_inputs": {"payload": json.dumps({"model": "m1"})},
           "response_timestamps": [20 * ms, 30 * ms, 35 * ms, 45 * ms, 46 * ms, 47 * ms, 48 * ms],
           "response_outputs": [_sse(role), _sse(tok), _sse(tok), _sse(tok), _sse(fin), _sse(usage), _sse("[DONE]")]}
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"service_kind": "openai", "endpoint": "v1/chat/completions",
                                "experiments": [{"experiment": {"mode": "concurrency", "value": 1},
                                                 "requests": [req]}]}))
    (run,) = read_bench(path)
    np.testing.assert_allclose(run.ttft, [0.020])
    np.testing.assert_allclose(run.itl_gaps, [0.005, 0.010])
    np.testing.assert_allclose(run.latency, [0.035])
