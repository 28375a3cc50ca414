"""Bad trace files: one InputError naming file, line, column, the bad value and what was expected."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from batchsim.sim.errors import InputError
from batchsim.workloads import WorkloadConfig, build_workload

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
T0 = "2023-11-16 18:17:03.9799600"


def error_of(trace: dict, base: Path, **workload) -> str:
    cfg = WorkloadConfig.model_validate({"trace": trace, **workload})
    with pytest.raises(InputError) as e:
        build_workload(cfg, np.random.default_rng(0), base)
    return str(e.value)


def azure_error(tmp_path: Path, text: str) -> str:
    (tmp_path / "a.csv").write_text(text)
    return error_of({"format": "azure", "path": "a.csv"}, tmp_path)


def test_missing_file_names_the_path_as_written_and_resolved(tmp_path):
    msg = error_of({"format": "azure", "path": "nope.csv"}, tmp_path)
    assert msg == f"nope.csv: file not found (resolved to {(tmp_path / 'nope.csv').resolve()}); expected an existing trace file"


@pytest.mark.parametrize("text, expected", [
    ("", "file is empty; expected a header line and at least one row"),
    (AZ, "no data rows after the header; expected at least one request"),
    (AZ + "\n\n", "no data rows after the header; expected at least one request"),
])
def test_empty_files(tmp_path, text, expected):
    assert azure_error(tmp_path, text) == f"{tmp_path / 'a.csv'}: {expected}"


@pytest.mark.parametrize("body, where, what", [
    (f"{T0},4808,10\n{T0},-3,8\n", "line 3, column 'ContextTokens'", "negative value '-3'"),
    (f"{T0},4808,10\n{T0},,8\n", "line 3, column 'ContextTokens'", "missing value ''"),
    (f"{T0},4808,NaN\n", "line 2, column 'GeneratedTokens'", "missing value 'NaN'"),
    (f"{T0},abc,10\n", "line 2, column 'ContextTokens'", "'abc' is not a number"),
    (f"{T0},12.5,10\n", "line 2, column 'ContextTokens'", "'12.5' is not whole"),
    (f"{T0},inf,10\n", "line 2, column 'ContextTokens'", "infinite value 'inf'"),
    (f"{T0},1,10\n\n{T0},1\n", "line 4, column 'GeneratedTokens'", "missing value ''"),  # blank line 3 counted
    (f"{T0},true,10\n{T0},False,8\n", "line 2, column 'ContextTokens'", "'true' is a boolean"),  # pandas: a bool column
])
def test_bad_token_values(tmp_path, body, where, what):
    assert azure_error(tmp_path, AZ + body) == (
        f"{tmp_path / 'a.csv'}, {where}: {what}; expected a whole number of tokens >= 0")


def test_unparsable_timestamp(tmp_path):
    msg = azure_error(tmp_path, AZ + f"{T0},1,10\n16/11/2023 18:17,1,1\n")
    assert msg == (f"{tmp_path / 'a.csv'}, line 3, column 'TIMESTAMP': cannot parse timestamp '16/11/2023 18:17'; "
                   "expected an ISO 8601 timestamp like '2023-11-16 18:17:03.9799600'")


def test_missing_column_lists_what_the_file_has(tmp_path):
    msg = azure_error(tmp_path, "TIMESTAMP,ContextTokens\n" + f"{T0},4\n")
    assert msg == (f"{tmp_path / 'a.csv'}, line 1, column 'GeneratedTokens': column not found; "
                   "the file has columns: 'TIMESTAMP', 'ContextTokens'")


@pytest.mark.parametrize("body, line, row", [
    (f"{T0},1,10\n{T0},1,10,99\n", 3, f"{T0},1,10,99"),  # pandas itself refuses a later row
    # the first data row: pandas (index_col=False) dropped the extra field with only a warning
    (f"{T0},1,000,10\n{T0},2500,8\n", 2, f"{T0},1,000,10"),
    (f"{T0},1,000,10\n{T0},2,500,8\n", 2, f"{T0},1,000,10"),  # every row: read as 1,0 and 2,500
    (f"\n{T0},1,000,10\n", 3, f"{T0},1,000,10"),  # a blank line first still counts
])
def test_ragged_csv_row(tmp_path, body, line, row):
    msg = azure_error(tmp_path, AZ + body)
    assert msg == (f"{tmp_path / 'a.csv'}, line {line}: 4 fields where the header has 3: {row!r}; "
                   "expected one field per header column (quote a value that holds ',')")


def test_ragged_tsv_row_names_the_separator(tmp_path):
    (tmp_path / "a.tsv").write_text("t\tin\tout\n0\t5\t6\t7\n")
    msg = error_of({"format": "csv", "path": "a.tsv", "sep": "\t",
                    "columns": {"arrival": "t", "prompt_tokens": "in", "output_tokens": "out"}}, tmp_path)
    assert msg == (f"{tmp_path / 'a.tsv'}, line 2: 4 fields where the header has 3: '0\\t5\\t6\\t7'; "
                   "expected one field per header column (quote a value that holds '\\t')")


def mooncake_error(tmp_path: Path, text: str) -> str:
    (tmp_path / "m.jsonl").write_text(text)
    return error_of({"format": "mooncake", "path": "m.jsonl"}, tmp_path)


@pytest.mark.parametrize("text, where, what", [
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5 "output_length": 1}\n',
     "line 2", "not valid JSON (Expecting ',' delimiter): '{\"timestamp\": 1, \"input_length\": 5 \"output_length\": 1}'; "
               "expected one JSON object per line"),
    ("[1,2]\n", "line 1", "'[1,2]' is not a JSON object; expected one object per line"),
    ('{"timestamp": 0, "input_length": 5}\n', "line 1, column 'output_length'",
     "key not found; the object has keys: 'timestamp', 'input_length'"),
    ('\n{"timestamp": 0, "input_length": 5, "hash_ids": [1]}\n', "line 2, column 'output_length'",
     "key not found; the object has keys: 'timestamp', 'input_length', 'hash_ids'"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n\n{"timestamp": 1, "input_length": 5}\n',
     "line 3, column 'output_length'", "missing value; expected a whole number of tokens >= 0"),
    ('{"timestamp": 0, "input_length": "five", "output_length": 1}\n', "line 1, column 'input_length'",
     "'five' is not a number; expected a whole number of tokens >= 0"),
    ('{"timestamp": -4, "input_length": 5, "output_length": 1}\n', "line 1, column 'timestamp'",
     "negative value '-4'; expected a time in ms >= 0"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 5, "input_length": true, "output_length": 1}\n',
     "line 2, column 'input_length'", "'true' is a boolean; expected a whole number of tokens >= 0"),
    ('{"timestamp": false, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n', "line 1, column 'timestamp'",
     "'false' is a boolean; expected a time in ms >= 0"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": 7}\n', "line 1, column 'hash_ids'",
     "'7' is not a list of integers; expected a list of block hashes"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2.5]}\n', "line 1, column 'hash_ids'",
     "'[1, 2.5]' is not a list of integers; expected a list of block hashes"),
    # hash_ids on some rows only: read "'None' is not a list of integers"
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1, "input_length": 5, '
     '"output_length": 1}\n', "line 2, column 'hash_ids'",
     "missing value; expected a list of block hashes on every row (or on none)"),
    # ... and, when the first row had none and the fast path gave up (a float), were ignored without a word
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5, '
     '"output_length": 1, "hash_ids": [1, 2.5]}\n', "line 1, column 'hash_ids'",
     "missing value; expected a list of block hashes on every row (or on none)"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2}\n', "line 1",
     "not valid JSON (Expecting ',' delimiter): "
     "'{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"...'; "  # long lines are cut at 60
     "expected one JSON object per line"),
])
def test_bad_jsonl(tmp_path, text, where, what):
    assert mooncake_error(tmp_path, text) == f"{tmp_path / 'm.jsonl'}, {where}: {what}"


def test_blank_jsonl_is_empty(tmp_path):
    assert mooncake_error(tmp_path, "\n \n") == f"{tmp_path / 'm.jsonl'}: file is empty; expected one JSON object per line"


def test_burstgpt_filter_that_matches_nothing_lists_the_values():
    msg = error_of({"format": "burstgpt", "path": "burstgpt_small.csv", "model": "gpt4"}, FIXTURES)
    assert msg == (f"{FIXTURES / 'burstgpt_small.csv'}, column 'Model': no rows with value 'gpt4'; "
                   "expected one of: 'ChatGPT', 'GPT-4'")


def test_burstgpt_all_failed(tmp_path):
    (tmp_path / "b.csv").write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                    "1,ChatGPT,5,0,5,API log\n")
    msg = error_of({"format": "burstgpt", "path": "b.csv"}, tmp_path)
    assert msg == (f"{tmp_path / 'b.csv'}: every request is marked failed; expected at least one successful "
                   "request (or set failed: keep)")


def vllm_error(tmp_path: Path, **change) -> str:
    data = json.loads((FIXTURES / "vllm_bench_small.json").read_text())
    for k, v in change.items():
        if v is None:
            del data[k]
        else:
            data[k] = v
    (tmp_path / "v.json").write_text(json.dumps(data))
    return error_of({"format": "vllm_bench", "path": "v.json"}, tmp_path)


@pytest.mark.parametrize("change, where, what", [
    ({"input_lens": None}, "field 'input_lens'",
     "not found; expected per-request lists (run vllm bench serve with --save-result --save-detailed)"),
    ({"output_lens": [1, 2]}, "field 'output_lens'", "has 2 entries; expected 5, one per request like input_lens"),
    ({"output_lens": 7}, "field 'output_lens'", "'7' is not a list; expected one entry per request"),
    ({"input_lens": [120, 530, -64, 400, 36]}, "field 'input_lens[2]'",
     "negative value '-64'; expected a whole number of tokens >= 0"),
    ({"request_rate": None}, "field 'request_rate'",
     "'None' is not a rate; expected a number or \"inf\" (or set arrivals_from: arrival)"),
    ({"request_rate": 0}, "field 'request_rate'", "'0.0' is not positive; expected a rate > 0 or \"inf\""),
    ({"burstiness": -1}, "field 'burstiness'", "'-1' is not a positive number; expected vLLM's gamma shape (1 = Poisson)"),
    ({"input_lens": [], "output_lens": [], "errors": []}, "field 'input_lens'", "is empty; expected one entry per request"),
    # booleans: float(true) is 1.0, so each replayed as a 1 req/s rate, a Poisson shape or a 1-token prompt
    ({"request_rate": True}, "field 'request_rate'", "'true' is a boolean; expected a number or \"inf\""),
    ({"burstiness": True}, "field 'burstiness'", "'true' is a boolean; expected vLLM's gamma shape (1 = Poisson)"),
    ({"input_lens": [120, True, 64, 400, 36]}, "field 'input_lens[1]'",
     "'true' is a boolean; expected a whole number of tokens >= 0"),
    ({"output_lens": [100, 128, 0, False, 22]}, "field 'output_lens[3]'",
     "'false' is a boolean; expected a whole number of tokens >= 0"),
])
def test_bad_vllm_bench(tmp_path, change, where, what):
    assert vllm_error(tmp_path, **change) == f"{tmp_path / 'v.json'}, {where}: {what}"


CLOSED_HOW = "expected workload.arrival: {process: closed, concurrency: 8} with trace.arrivals_from: arrival"


@pytest.mark.parametrize("change, what", [
    # vllm bench serve --max-concurrency 8 (--request-rate inf): replayed every request at t = 0, saying nothing
    ({"request_rate": "inf", "max_concurrency": 8},
     "is 8 at request_rate inf: the run was a closed loop of 8 clients, whose send times depend on the server's "
     f"responses, so its arrivals are not replayed; {CLOSED_HOW}"),
    ({"request_rate": "inf", "max_concurrency": 8, "start_times": [0.0, 0.1, 0.2, 0.3, 0.4]},
     "is 8 at request_rate inf: the run was a closed loop of 8 clients, whose send times depend on the server's "
     f"responses, so its arrivals are not replayed; {CLOSED_HOW}"),
    # capped at a finite rate: replayed gamma gaps at the uncapped rate
    ({"request_rate": 4.0, "max_concurrency": 8},
     "is 8 at request_rate 4 and the file has no start_times: requests sent at a rate and capped at 8 in flight "
     "are neither an open nor a closed loop, so their arrivals cannot be regenerated; expected a file with "
     "start_times, or trace.arrivals_from: arrival with a workload.arrival (a closed loop: "
     "{process: closed, concurrency: 8}, or a rate)"),
    ({"max_concurrency": 0}, "'0' is not a client count; expected a positive integer or null"),
    ({"max_concurrency": True}, "'true' is not a client count; expected a positive integer or null"),
])
def test_vllm_bench_capped_by_max_concurrency_is_refused_with_the_fix(tmp_path, change, what):
    assert vllm_error(tmp_path, **change) == f"{tmp_path / 'v.json'}, field 'max_concurrency': {what}"


def test_vllm_bench_capped_run_replays_with_start_times_or_the_closed_loop_it_names(tmp_path):
    data = json.loads((FIXTURES / "vllm_bench_small.json").read_text())
    starts = [0.0, 0.5, 0.75, 2.0, 2.5]
    (tmp_path / "v.json").write_text(json.dumps({**data, "max_concurrency": 8, "start_times": starts}))
    wl = build_workload(WorkloadConfig.model_validate({"trace": {"format": "vllm_bench", "path": "v.json"}}),
                        np.random.default_rng(0), tmp_path)
    assert wl.arrival.tolist() == [0.0, 0.5, 2.0, 2.5]  # the saved send times (request 2 failed)
    (tmp_path / "v.json").write_text(json.dumps({**data, "request_rate": "inf", "max_concurrency": 8}))
    wl = build_workload(WorkloadConfig.model_validate({
        "arrival": {"process": "closed", "concurrency": 8},
        "trace": {"format": "vllm_bench", "path": "v.json", "arrivals_from": "arrival"}}), np.random.default_rng(0), tmp_path)
    assert wl.closed is not None and wl.closed.concurrency == 8 and len(wl) == 4


def test_vllm_bench_not_json(tmp_path):
    (tmp_path / "v.json").write_text('{"input_lens": [1,\n  2,,]}')
    msg = error_of({"format": "vllm_bench", "path": "v.json"}, tmp_path)
    assert msg == (f"{tmp_path / 'v.json'}, line 2: not valid JSON (Expecting value); "
                   "expected the object vllm bench serve saves")


def test_empty_window_says_what_the_trace_spans():
    msg = error_of({"format": "azure", "path": "azure_code_small.csv", "start_s": 100}, FIXTURES)
    assert msg == (f"{FIXTURES / 'azure_code_small.csv'}: no requests in the window start_s=100.0, end_s=None; "
                   "the trace spans 0 to 6.27004 s after its first request")


def test_a_sample_that_rounds_to_no_rows_is_an_error_not_an_empty_run():
    # lengths_small.csv has 3 rows: 0.1 of them rounds to 0 (the run had no requests and exited 0)
    msg = error_of({"format": "lengths", "path": "lengths_small.csv", "sample": 0.1}, FIXTURES,
                   arrival={"process": "poisson", "rate": 2.0})
    assert msg == (f"workload.trace.sample ({FIXTURES / 'lengths_small.csv'}): 0.1 of the 3 rows rounds to 0 rows; "
                   "expected a fraction that keeps at least one row (1/3 = 0.333)")
    cfg = WorkloadConfig.model_validate({"num_requests": 4, "arrival": {"process": "empirical", "trace": {
        "format": "azure", "path": "azure_code_small.csv", "sample": 0.05}}})
    with pytest.raises(InputError, match=re.escape(
            f"workload.arrival.trace.sample ({FIXTURES / 'azure_code_small.csv'}): 0.05 of the 5 rows rounds to 0")):
        build_workload(cfg, np.random.default_rng(0), FIXTURES)
    # the suggested fraction keeps one row
    cfg = WorkloadConfig.model_validate({"arrival": {"process": "poisson", "rate": 2.0},
                                         "trace": {"format": "lengths", "path": "lengths_small.csv", "sample": 0.333}})
    assert len(build_workload(cfg, np.random.default_rng(0), FIXTURES)) == 1


def test_empirical_arrival_needs_two_distinct_times(tmp_path):
    (tmp_path / "t.csv").write_text("arrival,prompt_tokens,output_tokens\n3,1,1\n3,1,1\n")
    cfg = WorkloadConfig.model_validate({"num_requests": 5, "arrival": {
        "process": "empirical", "trace": {"format": "csv", "path": "t.csv"}}})
    with pytest.raises(InputError, match=re.escape(
            "workload.arrival.trace (t.csv): 2 request(s) spanning 0.0 s; "
            "expected at least two distinct arrival times to take gaps from")):
        build_workload(cfg, np.random.default_rng(0), tmp_path)


def test_empirical_length_column_errors(tmp_path):
    (tmp_path / "l.csv").write_text("n\n5\n-1\n")
    cfg = WorkloadConfig.model_validate({"num_requests": 3, "prompt_tokens": {
        "dist": "empirical", "path": "l.csv", "column": "n"}})
    with pytest.raises(InputError) as e:
        build_workload(cfg, np.random.default_rng(0), tmp_path)
    assert str(e.value) == f"{tmp_path / 'l.csv'}, line 3, column 'n': negative value '-1'; expected a whole number of tokens >= 0"
    cfg = WorkloadConfig.model_validate({"num_requests": 3, "prompt_tokens": {
        "dist": "empirical", "path": "l.csv", "column": "m"}})
    with pytest.raises(InputError, match=re.escape("line 1, column 'm': column not found; the file has columns: 'n'")):
        build_workload(cfg, np.random.default_rng(0), tmp_path)


def test_a_row_empty_only_in_the_used_columns_is_an_error_not_a_blank_line(tmp_path):
    (tmp_path / "t.csv").write_text("arrival,prompt_tokens,output_tokens,note\n0,1,1,a\n,,,b\n")
    msg = error_of({"format": "csv", "path": "t.csv"}, tmp_path)
    assert msg == f"{tmp_path / 't.csv'}, line 3, column 'arrival': missing value ''; expected a time in s >= 0"


def test_vllm_bench_not_utf8(tmp_path):
    (tmp_path / "v.json").write_bytes(b'{"input_lens": [1], "x": "\xff"}')
    msg = error_of({"format": "vllm_bench", "path": "v.json"}, tmp_path)
    assert msg == f"{tmp_path / 'v.json'}: not UTF-8 text (invalid start byte); expected the JSON vllm bench serve saves"


def test_one_rule_says_how_a_saved_bench_run_sent_its_requests():
    """batchsim.sim.sending is the one statement both readers of vllm bench files use
    (calibrate --from-bench and the vllm_bench trace): a closed loop at an infinite rate with a
    cap (even with saved send times: they were the old server's), a burst without one, saved send
    times at a finite rate, a gamma draw without them, and neither loop when capped without them."""
    import math

    from batchsim.sim.sending import BURST, CLOSED, NEITHER, RATE, SAVED, sending

    assert sending(math.inf, 8, False) == CLOSED and sending(math.inf, 8, True) == CLOSED
    assert sending(math.inf, None, False) == BURST and sending(math.inf, None, True) == BURST
    assert sending(4.0, 8, True) == SAVED and sending(4.0, None, True) == SAVED
    assert sending(4.0, None, False) == RATE
    assert sending(4.0, 8, False) == NEITHER
