"""calibrate --from-bench / validate --bench on the inputs a review found mishandled: repeated
benchmarks, runs capped in flight at a rate, one-token outputs, GuideLLM's per-request ITL, the
model a file names, the deployment a profile was fitted on, and terms the data cannot fix."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from batchsim.app.bench_fit import BenchSetup, bench_model, catalog_model, fit_bench, load_runs, validate_bench
from batchsim.app.cli import app
from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import build_parts, simulate
from batchsim.calibrate.bench import read_bench, run_from_records, write_guidellm, write_vllm_bench
from batchsim.calibrate.hardware import load_hardware
from batchsim.sim.errors import InputError

TRUE = {"host": {"per_step_us": 900.0, "per_seq_us": 12.0},
        "frontend": {"per_request_us": 4000.0, "per_prompt_token_us": 3.0}}
SETUP = BenchSetup(model="llama-3-8b", hardware="h100-sxm")


def _run(label, rate, n=60, seed=0, prompt=None, output=None, hardware="h100-sxm"):
    raw = {"name": "t", "model": "llama-3-8b", "hardware": hardware, "engine_preset": "vllm-v1", "seed": seed,
           "overheads": TRUE,
           "workload": {"num_requests": n, "arrival": {"process": "poisson", "rate": rate},
                        "prompt_tokens": prompt or {"dist": "lognormal", "median": 400, "p90": 1500, "max": 4000},
                        "output_tokens": output or {"dist": "lognormal", "median": 60, "p90": 200, "max": 400}}}
    sc = scenario_from_dict(raw)
    r = simulate(sc, build_parts(sc))
    run = run_from_records(r.requests, r.itl.frame(), label=label, mode="rate", rate=rate)
    return dataclasses.replace(run, model="meta-llama/Meta-Llama-3-8B-Instruct")


def _truth_profile(tmp_path):
    data = load_hardware("h100-sxm").model_dump(mode="json")
    data["host_overhead"].update(TRUE["host"])
    data["frontend"] = TRUE["frontend"]
    path = tmp_path / "truth.yaml"
    path.write_text(json.dumps(data))
    return path


def test_benchmarks_with_the_same_label_get_labels_of_their_own_and_a_report(tmp_path):
    a = write_vllm_bench(tmp_path / "a.json", _run("rate=4", 4.0))
    b = tmp_path / "b.json"
    shutil.copy(a, b)
    runs = load_runs([a, b])
    assert [r.label for r in runs] == ["rate=4.0 [a.json]", "rate=4.0 [b.json]"]
    res = CliRunner().invoke(app, ["validate", "--bench", str(a), "--bench", str(b), "--profile",
                                   str(_truth_profile(tmp_path)), "--out", str(tmp_path / "val")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "val" / "bench.png").is_file()


def test_a_rate_capped_in_flight_without_send_times_is_refused(tmp_path):
    path = write_vllm_bench(tmp_path / "r.json", _run("rate=4", 4.0, n=20))
    data = json.loads(path.read_text())
    del data["start_times"]
    data["max_concurrency"] = 8
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="max_concurrency 8 caps it in flight"):
        read_bench(path)


def test_one_token_outputs_validate_on_ttft_and_write_strict_json(tmp_path):
    run = _run("rate=4", 4.0, n=30, output={"dist": "fixed", "value": 1})
    path = write_vllm_bench(tmp_path / "one.json", run)
    res = CliRunner().invoke(app, ["validate", "--bench", str(path), "--profile", str(_truth_profile(tmp_path)),
                                   "--out", str(tmp_path / "val")])
    assert res.exit_code == 0, res.output
    assert "without a measured value" in res.output
    text = (tmp_path / "val" / "bench.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in bench.json"))


def test_guidellm_itl_is_compared_as_per_request_means(tmp_path):
    path = write_guidellm(tmp_path / "g.json", [_run("poisson@4", 4.0, n=60)])
    rows = validate_bench(load_runs([path]), SETUP, str(_truth_profile(tmp_path)))
    itl = [r for r in rows if r["metric"] == "itl"]
    assert itl and all(abs(r["rel_error"]) < 1e-3 for r in itl), itl


def test_the_model_comes_from_the_file_when_not_given_and_a_mismatch_is_said():
    run = _run("rate=4", 4.0, n=10)
    assert catalog_model("meta-llama/Llama-3.1-70B-Instruct") == "llama-3.1-70b"
    assert catalog_model("/models/my-finetune") is None
    assert bench_model([run], None) == ("llama-3-8b", "model llama-3-8b (from the benchmark files' model "
                                                      "meta-llama/Meta-Llama-3-8B-Instruct)")
    model, note = bench_model([run], "llama-3.1-70b")
    assert model == "llama-3.1-70b" and "--model is llama-3.1-70b" in note
    with pytest.raises(InputError, match="not in batchsim's catalog"):
        bench_model([dataclasses.replace(run, model="/models/my-finetune")], None)
    with pytest.raises(InputError, match="name no model"):
        bench_model([dataclasses.replace(run, model=None)], None)


def test_validate_replays_on_the_deployment_the_profile_was_fitted_on(tmp_path):
    files = [write_vllm_bench(tmp_path / f"r{r}.json", _run(f"rate={r}", float(r), n=40, seed=r)) for r in (3, 9)]
    args = ["calibrate", "--out", str(tmp_path / "p.yaml"), "--engine-preset", "sglang",
            "--policy-set", "max_num_seqs=64"]
    for f in files:
        args += ["--from-bench", str(f)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "model llama-3-8b (from the benchmark files' model" in res.output
    res = CliRunner().invoke(app, ["validate", "--bench", str(files[1]), "--profile", str(tmp_path / "p.yaml"),
                                   "--out", str(tmp_path / "val"), "--p50-tol", "10"])
    assert res.exit_code == 0, res.output
    assert "engine_preset 'sglang'" in res.output and "'max_num_seqs': 64" in res.output
    dep = json.loads((tmp_path / "val" / "bench.json").read_text())["deployment"]
    assert dep["engine_preset"] == "sglang" and dep["policy"] == {"max_num_seqs": 64} and dep["model"] == "llama-3-8b"


def test_prompts_of_one_length_leave_the_per_token_term_unfitted_and_say_why(tmp_path):
    fixed = {"dist": "fixed", "value": 1000}
    runs = load_runs([write_vllm_bench(tmp_path / f"f{r}.json", _run(f"rate={r}", float(r), n=60, seed=r,
                                                                      prompt=fixed)) for r in (4, 12)])
    fit = fit_bench(runs, SETUP, fit_on=["rate=4.0", "rate=12.0"])
    assert "frontend.per_prompt_token_us" in fit.unfitted
    assert "1000 tokens" in fit.unfitted_why["frontend.per_prompt_token_us"]
    # the per-request term carries both: 4000 us + 3 us x 1000 tokens
    assert fit.terms["frontend.per_request_us"] == pytest.approx(7000.0, rel=0.05)
    assert "not_fitted_why" in fit.profile.provenance["from_bench"]


def test_terms_held_at_zero_are_reported_not_hidden(tmp_path):
    # the engine ran on an H200; fitted against the slower H100 profile, no overhead can explain it
    runs = load_runs([write_vllm_bench(tmp_path / f"h{r}.json", _run(f"rate={r}", float(r), n=60, seed=r,
                                                                      hardware="h200")) for r in (4, 12)])
    fit = fit_bench(runs, SETUP)
    assert "host.per_step_us" in fit.pinned
    assert fit.profile.provenance["from_bench"]["pinned_at_zero"] == fit.pinned


def test_two_requests_leave_the_frontend_terms_unfitted(tmp_path):
    runs = load_runs([write_vllm_bench(tmp_path / "two.json", _run("rate=4", 4.0, n=2))])
    fit = fit_bench(runs, SETUP)
    assert {"frontend.per_request_us", "frontend.per_prompt_token_us"} <= set(fit.unfitted)
    assert "frontend.per_request_us" not in fit.profile.provenance["from_bench"]["fitted"]


def test_a_request_the_simulator_cannot_run_is_named_by_its_place_in_the_file(tmp_path):
    run = _run("rate=4", 4.0, n=20)
    prompts = run.input_tokens.copy()
    prompts[7] = 200_000  # beyond llama-3-8b's 8192-token context
    path = write_vllm_bench(tmp_path / "big.json", dataclasses.replace(run, input_tokens=prompts))
    data = json.loads(path.read_text())
    for key in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times"):
        data[key] = data[key][::-1]  # the file's own order differs from the send order
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"the file's request 12, 200000 prompt tokens"):
        fit_bench(load_runs([path]), SETUP)


def test_a_report_that_is_a_file_is_refused_before_anything_is_written(tmp_path):
    path = write_vllm_bench(tmp_path / "r.json", _run("rate=4", 4.0, n=10))
    (tmp_path / "afile").write_text("")
    res = CliRunner().invoke(app, ["calibrate", "--from-bench", str(path), "--out", str(tmp_path / "p.yaml"),
                                   "--report", str(tmp_path / "afile")])
    assert isinstance(res.exception, InputError) and "is a file" in str(res.exception)  # (exit 2 from the CLI)
    assert not (tmp_path / "p.yaml").exists()


def test_fitting_every_benchmark_says_so_rather_than_one_benchmark_only(tmp_path):
    files = [write_vllm_bench(tmp_path / f"r{r}.json", _run(f"rate={r}", float(r), n=30, seed=r)) for r in (3, 9)]
    res = CliRunner().invoke(app, ["calibrate", "--from-bench", str(files[0]), "--from-bench", str(files[1]),
                                   "--fit-on", "rate=3.0", "--fit-on", "rate=9.0", "--out", str(tmp_path / "p.yaml")])
    assert res.exit_code == 0, res.output
    assert "every benchmark was fitted" in res.output and "one benchmark only" not in res.output


def test_a_profile_fitted_again_keeps_the_device_it_started_from(tmp_path):
    from batchsim.calibrate.hardware import save_hardware

    runs = load_runs([write_vllm_bench(tmp_path / "r.json", _run("rate=4", 4.0, n=30))])
    first = fit_bench(runs, BenchSetup(model="llama-3-8b", hardware="a100-80gb"), name="prod-gpu")
    path = save_hardware(first.profile, tmp_path / "prod.yaml")
    again = fit_bench(runs, BenchSetup(model="llama-3-8b", hardware=str(path)), name="prod-gpu-2")
    assert again.profile.provenance["from_bench"]["base_profile"] == "a100-80gb"


def test_guidellm_replay_survives_a_last_request_of_one_token(tmp_path):
    run = _run("poisson@4", 4.0, n=20)
    out = run.output_tokens.copy()
    last = int(np.argmax(run.start))
    out[last] = 1
    lat = run.latency.copy()
    lat[last] = run.ttft[last]
    lens = np.maximum(out - 1, 0)
    gaps = np.concatenate([run.gaps(i)[:lens[i]] for i in range(len(run))])
    one = dataclasses.replace(run, output_tokens=out, latency=lat, itl_gaps=gaps,
                              itl_offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    mean = one.with_mean_gaps()
    assert len(mean.itl_gaps) == len(gaps) and mean.gaps(last).size == 0
    path = write_guidellm(tmp_path / "g.json", [one])
    assert validate_bench(load_runs([path]), SETUP, str(_truth_profile(tmp_path)))


def test_files_naming_two_models_are_refused_even_if_one_is_not_in_the_catalog():
    run = _run("rate=4", 4.0, n=10)
    with pytest.raises(InputError, match="several models"):
        bench_model([dataclasses.replace(run, model="Qwen/Qwen3-8B"),
                     dataclasses.replace(run, model="meta-llama/Llama-3.1-8B-Instruct")], None)


def test_fit_on_a_label_made_unique_still_selects_it(tmp_path):
    a = write_vllm_bench(tmp_path / "a.json", _run("rate=4", 4.0, n=20))
    b = write_vllm_bench(tmp_path / "b.json", _run("rate=9", 9.0, n=20, seed=1))
    c = tmp_path / "c.json"
    shutil.copy(a, c)
    from batchsim.app.bench_fit import _split

    runs = load_runs([a, b, c])
    assert _split(runs, ["rate=4.0"]) == [True, False, True]
    assert _split(runs, ["rate=4.0 [c.json]"]) == [False, False, True]
    assert "fp8 weights" in bench_model([dataclasses.replace(runs[0], model="meta-llama/Llama-3.1-8B-Instruct-FP8")],
                                        None)[1]
