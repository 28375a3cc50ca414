"""Every trace format on small fixtures, with exact values, and the shared options."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from batchsim.workloads import WorkloadConfig, build_workload

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"


def build(trace: dict, seed: int = 0, base: Path = FIXTURES, **workload):
    cfg = WorkloadConfig.model_validate({"trace": trace, **workload})
    return build_workload(cfg, np.random.default_rng(seed), base)


def test_azure_parses_seven_digit_timestamps_and_rebases():
    w = build({"format": "azure", "path": "azure_code_small.csv"})
    assert w.arrival.tolist() == [0.0, 0.052, 0.52004, 2.0200401, 6.27004]
    assert w.prompt_tokens.tolist() == [4808, 3180, 110, 7437, 1]  # 0 clipped to 1
    assert w.output_tokens.tolist() == [10, 8, 27, 1, 250]
    assert w.prefix_hashes is None and w.prefix_block_tokens == 0
    assert w.arrival.dtype == np.float64 and w.prompt_tokens.dtype == np.int64


def test_azure_2024_timestamps_with_zone_and_without_fraction(tmp_path):
    (tmp_path / "a.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2024-05-10 00:00:00.009930+00:00,10,1\n"
                                    "2024-05-10 00:00:01+00:00,20,2\n"
                                    "2024-05-10 02:00:02.5+02:00,30,3\n")
    w = build({"format": "azure", "path": "a.csv"}, base=tmp_path)
    assert w.arrival.tolist() == [0.0, 0.99007, 2.49007]


def test_mooncake_ms_timestamps_and_prefix_hashes():
    w = build({"format": "mooncake", "path": "mooncake_small.jsonl"})
    assert w.arrival.tolist() == [0.0, 0.0, 0.04, 1.25]
    assert w.prompt_tokens.tolist() == [1100, 600, 512, 2000]
    assert w.output_tokens.tolist() == [6, 4, 3, 120]
    assert w.prefix_hashes == ((0, 1, 2), (0, 3), (4,), (0, 1, 5, 6))
    assert w.prefix_block_tokens == 512


def test_mooncake_without_hash_ids_has_no_prefixes(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"timestamp": 5, "input_length": 3, "output_length": 2}\n')
    w = build({"format": "mooncake", "path": "m.jsonl"}, base=tmp_path)
    assert w.prefix_hashes is None and w.prefix_block_tokens == 0


def test_mooncake_hash_ids_fast_and_json_paths_agree(tmp_path):
    rows = [{"timestamp": i, "input_length": 9, "output_length": 1, "hash_ids": [i, i + 1]} for i in range(3)]
    rows.append({"timestamp": 3, "input_length": 9, "output_length": 1, "hash_ids": []})
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    w = build({"format": "mooncake", "path": "m.jsonl"}, base=tmp_path)
    assert w.prefix_hashes == ((0, 1), (1, 2), (2, 3), ())
    rows[0]["hash_ids"] = [2**64, 1]  # beyond int64: numpy cannot parse it, json can
    (tmp_path / "n.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    w = build({"format": "mooncake", "path": "n.jsonl"}, base=tmp_path)
    assert w.prefix_hashes == ((2**64, 1), (1, 2), (2, 3), ())


def test_burstgpt_drops_failed_rows_by_default():
    w = build({"format": "burstgpt", "path": "burstgpt_small.csv"})
    assert w.arrival.tolist() == [0.0, 113.0, 120.0, 125.0, 195.0]
    assert w.prompt_tokens.tolist() == [472, 417, 1360, 1, 333]
    assert w.output_tokens.tolist() == [18, 217, 247, 35, 75]


def test_burstgpt_filters_and_keeps_failed():
    w = build({"format": "burstgpt", "path": "burstgpt_small.csv", "model": "ChatGPT",
               "log_type": "Conversation log", "failed": "keep"})
    assert w.arrival.tolist() == [0.0, 40.0, 195.0]
    assert w.output_tokens.tolist() == [18, 1, 75]  # the failed row's 0 is raised to 1
    w = build({"format": "burstgpt", "path": "burstgpt_small.csv", "model": ["GPT-4", "ChatGPT"], "log_type": "API log"})
    assert w.prompt_tokens.tolist() == [1360, 1]


def test_vllm_bench_recorded_rate_regenerates_gamma_arrivals():
    w = build({"format": "vllm_bench", "path": "vllm_bench_small.json"})
    assert w.prompt_tokens.tolist() == [120, 530, 400, 36]  # the errored request is dropped
    assert w.output_tokens.tolist() == [100, 128, 150, 22]
    assert w.arrival[0] == 0.0 and np.all(np.diff(w.arrival) > 0)
    again = build({"format": "vllm_bench", "path": "vllm_bench_small.json"})
    assert np.array_equal(w.arrival, again.arrival)


def test_vllm_bench_arrivals_from_the_arrival_section_and_inf_rate(tmp_path):
    w = build({"format": "vllm_bench", "path": "vllm_bench_small.json", "arrivals_from": "arrival", "failed": "keep"},
              arrival={"process": "constant", "rate": 2.0})
    assert w.arrival.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert w.output_tokens.tolist() == [100, 128, 1, 150, 22]
    data = json.loads((FIXTURES / "vllm_bench_small.json").read_text())
    data["request_rate"] = "inf"
    (tmp_path / "r.json").write_text(json.dumps(data))
    assert build({"format": "vllm_bench", "path": "r.json"}, base=tmp_path).arrival.tolist() == [0.0] * 4


def test_vllm_bench_start_times_are_used_when_present(tmp_path):
    data = json.loads((FIXTURES / "vllm_bench_small.json").read_text())
    data["start_times"] = [100.0, 100.5, 100.7, 101.0, 103.0]
    (tmp_path / "r.json").write_text(json.dumps(data))
    w = build({"format": "vllm_bench", "path": "r.json"}, base=tmp_path)
    assert w.arrival.tolist() == [0.0, 0.5, 1.0, 3.0]


def test_generic_csv_with_column_mapping_and_ms():
    w = build({"format": "csv", "path": "generic_ms.csv", "time_unit": "ms",
               "columns": {"arrival": "t_ms", "prompt_tokens": "in", "output_tokens": "out"}})
    assert w.arrival.tolist() == [0.0, 0.25, 0.25, 1.0]
    assert w.prompt_tokens.tolist() == [10, 20, 30, 40]
    assert w.output_tokens.tolist() == [5, 6, 7, 8]


def test_generic_jsonl_skips_blank_lines_and_keep_time():
    assert build({"format": "jsonl", "path": "generic.jsonl"}).arrival.tolist() == [0.0, 0.5, 2.5]
    w = build({"format": "jsonl", "path": "generic.jsonl", "keep_time": True})
    assert w.arrival.tolist() == [1.5, 2.0, 4.0]
    assert w.output_tokens.tolist() == [10, 20, 30]


@pytest.mark.parametrize("unit, values, expected", [
    ("s", ["3", "4.5"], [0.0, 1.5]),
    ("us", ["1000000", "1500000"], [0.0, 0.5]),
    ("ns", ["0", "250000000"], [0.0, 0.25]),
    ("datetime", ["2024-05-01T10:00:00", "2024-05-01T10:01:00.5"], [0.0, 60.5]),
])
def test_generic_csv_time_units(tmp_path, unit, values, expected):
    (tmp_path / "t.csv").write_text("arrival,prompt_tokens,output_tokens\n" + "".join(f"{v},5,5\n" for v in values))
    assert build({"format": "csv", "path": "t.csv", "time_unit": unit}, base=tmp_path).arrival.tolist() == expected


def test_generic_csv_separator(tmp_path):
    (tmp_path / "t.tsv").write_text("arrival\tprompt_tokens\toutput_tokens\n0\t5\t6\n1\t7\t8\n")
    w = build({"format": "csv", "path": "t.tsv", "sep": "\t"}, base=tmp_path)
    assert w.prompt_tokens.tolist() == [5, 7]


def test_lengths_replayed_with_the_arrival_process_cycle_rows():
    w = build({"format": "lengths", "path": "lengths_small.csv"}, num_requests=5,
              arrival={"process": "constant", "rate": 2.0})
    assert w.arrival.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert w.prompt_tokens.tolist() == [74, 290, 1000, 74, 290]
    assert w.output_tokens.tolist() == [918, 905, 10, 918, 905]


def test_lengths_without_a_count_replays_each_row_once_and_by_duration():
    w = build({"format": "lengths", "path": "lengths_small.csv"}, arrival={"process": "constant", "rate": 1.0})
    assert w.prompt_tokens.tolist() == [74, 290, 1000] and w.arrival.tolist() == [0.0, 1.0, 2.0]
    w = build({"format": "lengths", "path": "lengths_small.csv"}, duration_s=1.9, arrival={"process": "constant", "rate": 2.0})
    assert w.arrival.tolist() == [0.0, 0.5, 1.0, 1.5]


def test_lengths_shuffle_is_seeded_permutation_and_columns_map():
    a = build({"format": "lengths", "path": "lengths_small.csv", "shuffle": True}, seed=3)
    b = build({"format": "lengths", "path": "lengths_small.csv", "shuffle": True}, seed=3)
    assert a.prompt_tokens.tolist() == b.prompt_tokens.tolist()
    assert sorted(a.prompt_tokens.tolist()) == [74, 290, 1000]
    w = build({"format": "lengths", "path": "lengths_small.csv",
               "columns": {"prompt_tokens": "num_total_tokens", "output_tokens": "num_decode_tokens"}})
    assert w.prompt_tokens.tolist() == [992, 1195, 1010]


def test_lengths_from_jsonl_by_suffix_with_sample(tmp_path):
    (tmp_path / "l.jsonl").write_text("".join(f'{{"p": {i + 1}, "o": {2 * i + 1}}}\n' for i in range(10)))
    w = build({"format": "lengths", "path": "l.jsonl", "columns": {"prompt_tokens": "p", "output_tokens": "o"},
               "sample": 0.5}, base=tmp_path, arrival={"process": "constant", "rate": 1.0})
    assert len(w) == 5 and np.all(np.diff(w.prompt_tokens) > 0)
    assert np.array_equal(w.output_tokens, 2 * w.prompt_tokens - 1)


# ---------------------------------------------------------------- shared options


def _csv(tmp_path: Path, times: list[float], name: str = "t.csv") -> str:
    rows = "".join(f"{t},{i + 1},{i + 2}\n" for i, t in enumerate(times))
    (tmp_path / name).write_text("arrival,prompt_tokens,output_tokens\n" + rows)
    return name


def test_window_speedup_and_rebase(tmp_path):
    name = _csv(tmp_path, [10, 11, 12, 14, 18, 30])
    w = build({"format": "csv", "path": name, "start_s": 1, "end_s": 8}, base=tmp_path)
    assert w.arrival.tolist() == [0.0, 1.0, 3.0]  # relative times 1, 2, 4; 8 is past the end
    assert w.prompt_tokens.tolist() == [2, 3, 4]
    w = build({"format": "csv", "path": name, "start_s": 1, "end_s": 8.5, "speedup": 2}, base=tmp_path)
    assert w.arrival.tolist() == [0.0, 0.5, 1.5, 3.5]
    w = build({"format": "csv", "path": name, "start_s": 1, "speedup": 2, "keep_time": True}, base=tmp_path)
    assert w.arrival.tolist() == [5.5, 6.0, 7.0, 9.0, 15.0]


def test_max_requests_sample_min_tokens_and_workload_caps(tmp_path):
    name = _csv(tmp_path, list(range(100)))
    w = build({"format": "csv", "path": name, "max_requests": 3, "min_tokens": 2}, base=tmp_path)
    assert w.prompt_tokens.tolist() == [2, 2, 3] and w.output_tokens.tolist() == [2, 3, 4]
    s = build({"format": "csv", "path": name, "sample": 0.25}, base=tmp_path, seed=7)
    assert len(s) == 25 and np.all(np.diff(s.prompt_tokens) > 0)  # a subset, in order
    assert s.arrival[0] == 0.0
    s2 = build({"format": "csv", "path": name, "sample": 0.25}, base=tmp_path, seed=7)
    assert np.array_equal(s.prompt_tokens, s2.prompt_tokens)
    w = build({"format": "csv", "path": name}, base=tmp_path, num_requests=10, duration_s=4.5)
    assert w.arrival.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert len(build({"format": "csv", "path": name, "max_requests": 0}, base=tmp_path)) == 0


def test_unsorted_rows_are_sorted_with_a_warning(tmp_path):
    name = _csv(tmp_path, [0, 2, 1, 3])
    with pytest.warns(UserWarning) as rec:
        w = build({"format": "csv", "path": name}, base=tmp_path)
    assert str(rec[0].message) == (
        f"{tmp_path / name}: rows are not sorted by arrival time (line 4 is earlier than the row before it); "
        "replaying them sorted by time"
    )
    assert w.arrival.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert w.prompt_tokens.tolist() == [1, 3, 2, 4]


def test_a_run_over_unsorted_rows_says_so_in_its_summary(tmp_path, capfd):
    """The note is the run's, not a Python warning on stderr: it is in the summary's warnings
    (and so in every report of the run), naming the file and the line."""
    from batchsim.app.config import scenario_from_dict
    from batchsim.app.runner import build_parts, simulate

    name = _csv(tmp_path, [0, 2, 1, 3])
    sc = scenario_from_dict({"model": "llama-3.1-8b", "hardware": "h100-sxm", "policy": {"name": "continuous"},
                             "workload": {"trace": {"format": "csv", "path": str(tmp_path / name)}}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = simulate(sc, build_parts(sc)).summary
    assert summary["warnings"][0] == (f"{tmp_path / name}: rows are not sorted by arrival time (line 4 is earlier "
                                      "than the row before it); replaying them sorted by time")
    assert "UserWarning" not in capfd.readouterr().err


def test_sorted_trace_raises_no_warning(tmp_path):
    name = _csv(tmp_path, [0, 0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build({"format": "csv", "path": name}, base=tmp_path)


def test_absolute_path_and_no_base_dir(tmp_path, monkeypatch):
    name = _csv(tmp_path, [0, 1])
    cfg = WorkloadConfig.model_validate({"trace": {"format": "csv", "path": str(tmp_path / name)}})
    assert len(build_workload(cfg, np.random.default_rng(0))) == 2
    monkeypatch.chdir(tmp_path)
    cfg = WorkloadConfig.model_validate({"trace": {"format": "csv", "path": name}})
    assert len(build_workload(cfg, np.random.default_rng(0))) == 2
