"""``batchsim calibrate`` and ``batchsim validate``: fit a profile on a device, then check it.

Thin: each command parses its options, calls one library function
(:func:`batchsim.app.validate.calibrate_device`, or ``fit_calibration`` on read-back
evidence with ``--refit``; :func:`batchsim.app.validate.validate`, or ``replay`` with
``--replay``), shows a progress bar and prints the result. torch is imported inside the
command bodies only, so ``batchsim --help`` and simulations run without it.
``validate`` exits 1 when an error exceeds its tolerance, 2 on bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

__all__ = ["register", "calibrate_command", "validate_command"]

BENCH_P50_TOL = 0.10  # validate --bench: the TTFT/TPOT p50 error #22 asks a calibrated profile to stay within

DeviceOpt = Annotated[str, typer.Option(help="where to run the kernels: cpu, cuda or cuda:<index>")]
ThreadsOpt = Annotated[int, typer.Option(min=0, help="torch CPU threads while timing (0: leave torch's default)")]
GraphsOpt = Annotated[Optional[bool], typer.Option(
    "--graphs/--no-graphs", help="run the reference executor's pure-decode steps from CUDA graphs (default: on for "
    "cuda, off for cpu, where --graphs runs their static layout uncaptured); the outputs record how each step ran")]


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        from batchsim.sim.errors import InputError

        raise InputError("calibration needs torch: pip install 'batchsim[calibrate]'") from None


def _progress(description: str):
    """A rich progress bar and the ``(done, total, label)`` callback that drives it."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                   TimeElapsedColumn(), TextColumn("{task.fields[label]}"), transient=True)
    task = bar.add_task(description, total=1, label="")

    def tick(done: int, total: int, label: str) -> None:
        bar.update(task, completed=done, total=total, label=label)
    return bar, tick


def calibrate_command(
    out: Annotated[Path, typer.Option(help="profile YAML to write")],
    device: DeviceOpt = "cpu",
    dtype: Annotated[str, typer.Option(help="compute dtype: bf16 or fp16")] = "bf16",
    quick: Annotated[bool, typer.Option("--quick", help="smaller grids and fewer rounds (CI: well under a minute on a CPU)")] = False,
    model: Annotated[Optional[list[str]], typer.Option("--model", help="model whose shapes to time (repeatable; default tiny-llama on cpu, llama-3-8b on cuda); the first also runs whole steps for the host overhead")] = None,
    name: Annotated[Optional[str], typer.Option(help="profile name (default from the device)")] = None,
    threads: ThreadsOpt = 1,
    rounds: Annotated[Optional[int], typer.Option(min=1, help="timed rounds of every step (default 15, 7 with --quick)")] = None,
    evidence: Annotated[Optional[Path], typer.Option(help="folder for the measurements behind the profile: kernels.csv, steps.csv, facts.json")] = None,
    graphs: GraphsOpt = None,
    refit: Annotated[Optional[Path], typer.Option(help="fit again from an evidence folder instead of timing a device (no torch needed; the device, dtype, model and timing options are then those recorded)")] = None,
    from_bench: Annotated[Optional[list[Path]], typer.Option("--from-bench", help="fit the host and frontend overhead terms from a real engine's benchmark output instead (repeatable): vllm bench serve --save-result --save-detailed JSON, SGLang bench_serving --output-details JSONL, GuideLLM benchmarks.json, genai-perf profile_export.json; no device, no torch")] = None,
    hardware: Annotated[str, typer.Option(help="with --from-bench: the profile the engine ran on (name or path); its terms are the starting point")] = "h100-sxm",
    tp: Annotated[int, typer.Option(min=1, help="with --from-bench: tensor-parallel size of the benchmarked deployment")] = 1,
    engine_preset: Annotated[str, typer.Option(help="with --from-bench: the engine's preset (vllm-v1, vllm-v0, sglang, trtllm; 'none': the policy options alone)")] = "vllm-v1",
    policy_set: Annotated[Optional[list[str]], typer.Option("--policy-set", help="with --from-bench: KEY=VALUE over the preset's policy knobs (e.g. max_num_seqs=256), as the benchmarked server was started")] = None,
    fit_on: Annotated[Optional[list[str]], typer.Option("--fit-on", help="with --from-bench: benchmark labels or file names to fit on (the rest are held out; default: every other benchmark)")] = None,
    report: Annotated[Optional[Path], typer.Option(help="with --from-bench: folder for bench.csv, bench.json and bench.png (measured vs simulated per benchmark)")] = None,
) -> None:
    """Time real kernels on the device, fit a hardware profile, print the held-out fit error.
    With --from-bench: fit the overhead terms from a real engine's benchmark instead."""
    from rich.console import Console

    from batchsim.calibrate.hardware import save_hardware

    if from_bench:
        return _from_bench(from_bench, out, model, hardware, tp, dtype, engine_preset, policy_set, fit_on, report, name)
    if refit is not None:
        from batchsim.app.validate import fit_calibration, read_evidence

        cal = fit_calibration(*read_evidence(refit), name)
    else:
        _need_torch()
        from batchsim.app.validate import calibrate_device

        bar, tick = _progress("calibrating")
        with bar:
            cal = calibrate_device(device, dtype, quick=quick, models=model, threads=threads or None, name=name,
                                   progress=tick, rounds=rounds, graphs=graphs)
    save_hardware(cal.profile, out)
    if evidence is not None:
        from batchsim.app.validate import write_evidence

        write_evidence(cal, evidence)
    console = Console(highlight=False)
    held = cal.held_out
    how = f"refitted from {refit}" if refit is not None else f"{cal.seconds:.0f} s"
    console.print(f"profile {cal.profile.name} written to {out} ({len(cal.samples)} kernels timed, {how})")
    console.print(f"peak {cal.profile.peak_tflops} TFLOP/s, bandwidth {cal.profile.hbm_bandwidth_gbs:g} GB/s, "
                  f"launch {cal.profile.launch_latency_us:g} us, host {cal.profile.host_overhead.per_step_us:g} us/step "
                  f"+ {cal.profile.host_overhead.per_seq_us:g} us/seq "
                  f"+ {cal.profile.host_overhead.per_decode_step_us:g} us per step with decode rows")
    parts = ", ".join(f"{c} {v['median']:.1%}" for c, v in held.items() if c != "overall")
    console.print(f"held-out kernel error (median |predicted/measured - 1|): {held['overall']['median']:.1%} "
                  f"over {held['overall']['n']} kernels ({parts})")
    g = cal.facts.get("graphs")
    if g:
        from batchsim.calibrate.graphs import describe

        modes = ", ".join(f"{n} {m}" for m, n in g["steps"].items())
        console.print(f"whole steps ({describe(g)}): {modes}"
                      + (f"; {g['captured']} graphs captured in {g['capture_s']:.1f} s" if g["capture"] else ""))
        if g.get("capture_error"):
            console.print(f"[bold red]CUDA graph capture failed[/] (steps ran uncaptured): {g['capture_error']}")
    idle = cal.facts.get("device_idle")
    if idle:
        console.print(f"device idle between timed kernels: median {idle['median']:.1%}, p90 {idle['p90']:.1%}"
                      + (" [bold yellow](over 10%: some kernel times include launches)[/]" if idle["p90"] > 0.1 else ""))


def _policy_keys(pairs: list[str] | None, option: str) -> dict:
    import yaml

    from batchsim.sim.errors import InputError

    out = {}
    for pair in pairs or []:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise InputError(f"expected KEY=VALUE, got {pair!r}", option)
        out[key.strip()] = yaml.safe_load(value)
    return out


def _bench_setup(model, hardware, tp, dtype, engine_preset, policy_set, runs, hardware_option="--hardware"):
    """The deployment to replay the benchmarks on, and a note on where its model came from."""
    from batchsim.app.bench_fit import BenchSetup, bench_model

    models = model or []
    if len(models) > 1:
        from batchsim.sim.errors import InputError

        raise InputError("give one --model: the model the benchmark served", "--model")
    name, note = bench_model(runs, models[0] if models else None)
    setup = BenchSetup(model=name, hardware=hardware, tensor_parallel_size=tp,
                       dtype=dtype, engine_preset=None if engine_preset in ("none", "") else engine_preset,
                       policy=policy_set if isinstance(policy_set, dict) else _policy_keys(policy_set, "--policy-set"))
    _check_setup(setup, runs, hardware_option)
    return setup, note


# (a scenario's field -> the option that sets it here)
_SETUP_OPTIONS = (("engine_preset", "--engine-preset"), ("dtype", "--dtype"), ("tensor_parallel_size", "--tp"),
                  ("policy", "--policy-set"))


def _check_setup(setup, runs, hardware_option: str) -> None:
    """The deployment as the replay builds it, once, before any benchmark is replayed: an error in
    an option is named by the option, not by the first benchmark's file."""
    from batchsim.app.bench_fit import _scenario
    from batchsim.app.runner import build_cost
    from batchsim.sim.errors import InputError

    try:
        build_cost(_scenario(setup, runs[0], None))
    except InputError as e:
        text, run = str(e), f"{runs[0].source} [{runs[0].label}]: "
        text = text[len(run):] if text.startswith(run) else text
        for key, option in (*_SETUP_OPTIONS, ("hardware", hardware_option)):
            if text.startswith(f"{key}: "):  # (the option's own value)
                raise InputError(text[len(key) + 2:], option) from None
            if text.startswith(f"{key}."):  # (a key under it: policy.max_num_seqs)
                raise InputError(text, option) from None
        if "hardware profile" in text:
            raise InputError(text, hardware_option) from None
        raise


def _bench_table(rows: list[dict], title: str):
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for col in ("benchmark", "split", "metric", "measured ms", "simulated ms", "error"):
        table.add_column(col, justify="right" if col.endswith(("ms", "error")) else "left")
    for r in rows:  # (escaped: a label like "rate=4.0 [b.json]" is not rich markup)
        table.add_row(escape(r["label"]), r["split"], f"{r['metric']} {r['percentile']}", f"{r['measured_ms']:.2f}",
                      f"{r['simulated_ms']:.2f}", f"{r['rel_error']:+.1%}")
    return table


def _bench_reproduce(files, setup, fit, out, name, hardware) -> dict:
    """What reproduces a --from-bench profile: the profile it started from as given (and its
    sha256 when a file: a chain of calibrations starts each from the last), the version, and the
    one command (the fitted benchmarks named, so the split is the same whatever the default)."""
    import shlex

    from batchsim import __version__
    from batchsim.app.bench_fit import _sha

    cmd = ["batchsim", "calibrate"]
    for f in files:
        cmd += ["--from-bench", str(f)]
    cmd += ["--model", setup.model, "--hardware", str(hardware), "--tp", str(setup.tensor_parallel_size),
            "--dtype", setup.dtype, "--engine-preset", setup.engine_preset or "none"]
    for k, v in sorted((setup.policy or {}).items()):
        cmd += ["--policy-set", f"{k}={json.dumps(v) if isinstance(v, (list, dict, bool)) else v}"]
    for r in fit.runs:
        if r["split"] == "fit":
            cmd += ["--fit-on", r["label"]]
    if name:
        cmd += ["--name", name]
    cmd += ["--out", str(out)]
    started = {"hardware": str(hardware)}
    if Path(str(hardware)).is_file():
        started["sha256"] = _sha(str(hardware))
    return {"started_from": started, "batchsim_version": __version__, "fit_on": [r["label"] for r in fit.runs
                                                                              if r["split"] == "fit"],
            "reproduce": shlex.join(cmd)}


def _from_bench(files, out, model, hardware, tp, dtype, engine_preset, policy_set, fit_on, report, name) -> None:
    from rich.console import Console
    from rich.markup import escape

    from batchsim.app.bench_fit import fit_bench, load_runs, write_report
    from batchsim.calibrate.hardware import save_hardware
    from batchsim.sim.io import require_file, require_folder

    require_folder(report, "--report", "bench.csv, bench.json and bench.png")
    require_file(out, "--out", "the profile")  # (before the fit, not after it)
    runs = load_runs(files, distinct=True)
    setup, model_note = _bench_setup(model, hardware, tp, dtype, engine_preset, policy_set, runs)
    console = Console(width=None if Console().is_terminal else 120, highlight=False)
    if model_note:
        console.print(model_note)
    bar, tick = _progress("fitting")
    with bar:
        fit = fit_bench(runs, setup, fit_on=fit_on, progress=tick, name=name)
    if not fit.terms:  # (a profile that is its starting one under a new name would claim a fit)
        from batchsim.sim.errors import InputError

        why = "; ".join(f"{t}: {w}" for t, w in fit.unfitted_why.items())
        raise InputError(f"nothing could be fitted ({why}); no profile written", "--from-bench")
    fit.profile.provenance["from_bench"].update(_bench_reproduce(files, setup, fit, out, name, hardware))
    if report is not None:  # (first: a report that cannot be written leaves no profile behind)
        write_report(fit.rows, report, f"calibrate --from-bench: {setup.model} on {hardware}",
                     {"terms_us": fit.terms, "rounds": fit.rounds, "benchmarks": fit.runs,
                      "not_fitted": fit.unfitted_why, "pinned_at_zero": fit.pinned,
                      "frontend_fitted_on": fit.frontend_on})
    save_hardware(fit.profile, out)
    console.print(_bench_table(fit.rows, f"{setup.model} on {hardware}: measured vs simulated with the fitted terms"))
    terms = ", ".join(f"{k} {v:g}" for k, v in fit.terms.items())
    if fit.unfitted:
        terms += f" (not fitted, the profile's kept: {', '.join(fit.unfitted)})"
    console.print(f"fitted in {len(fit.rounds)} rounds on {sum(r['split'] == 'fit' for r in fit.runs)} of "
                  f"{len(fit.runs)} benchmarks: {terms}")
    for term, why in fit.unfitted_why.items():
        console.print(f"note: {term} not fitted: {why}")
    failed = [f"{escape(r['label'])}: {r['failed']}" for r in fit.runs if r.get("failed")]
    if failed:
        console.print(f"note: requests the benchmark marked failed were left out ({', '.join(failed)})")
    closed = [r["label"] for r in fit.runs if r["split"] == "fit" and r["mode"] == "concurrency"]
    if closed and any(t.startswith("frontend.") for t in fit.terms):
        why = ("a closed loop's clients send as a step ends, so a frontend delay moves its TTFT by whole steps, "
               "not by the delay (docs/fidelity.md)")
        if set(closed) & set(fit.frontend_on):
            console.print(f"note: the frontend terms were fitted on closed loops only ({', '.join(map(escape, closed))}): "
                          f"{why}; add an open-loop (rate) benchmark to fit them")
        else:
            console.print(f"note: the frontend terms were fitted on the open-loop benchmarks only; the closed "
                          f"loops ({', '.join(map(escape, closed))}) fitted the host terms: {why}")
    from batchsim.app.bench_fit import ROUNDS, TOLERANCE

    last = fit.rounds[-1]["change"] if fit.rounds else 0.0
    if not fit.converged:
        a, b = (fit.rounds[-2], fit.rounds[-1]) if len(fit.rounds) > 1 else ({}, fit.rounds[-1])
        moving = [f"{t} {a[t]:g} -> {b[t]:g} us" for t in fit.terms
                  if t in a and abs(b[t] - a[t]) / max(abs(b[t]), 0.01) > TOLERANCE]
        console.print(f"note: the fit stopped at {ROUNDS} rounds with the terms still moving ({last:.1%} in the "
                      f"last{': ' + ', '.join(moving) if moving else ''}; the rounds are in the report's "
                      "bench.json). A term moving near 0 is one the benchmarks barely constrain; terms far "
                      "apart call for a check of --model, --tp, --dtype and the policy keys against the "
                      "benchmarked server")
    if fit.pinned:
        console.print(f"note: {', '.join(fit.pinned)} held at 0, where the fit wanted less: the engine is faster "
                      f"than {hardware} predicts even with no overhead, so these terms cannot explain the gap; "
                      "check --hardware (or calibrate the device's kernels), --model, --tp, --dtype and the policy "
                      "keys against the benchmarked server")
    if all(r["split"] == "fit" for r in fit.runs):
        console.print("note: one benchmark only, nothing held out; give two or more (rates, concurrencies or files) "
                      "for a held-out check" if len(fit.runs) == 1 else
                      "note: every benchmark was fitted (--fit-on names them all), nothing held out")
    if report is not None:
        console.print(f"report written to {report}/")
    console.print(f"profile {fit.profile.name} written to {out}")


def validate_command(
    profile: Annotated[Path, typer.Option(help="calibrated profile YAML of this device")],
    out: Annotated[Path, typer.Option(help="output folder for validate.json, validate.csv and validate.png")],
    device: DeviceOpt = "cpu",
    model: Annotated[Optional[str], typer.Option(help="model to execute (default tiny-llama on cpu, llama-3-8b on cuda)")] = None,
    policies: Annotated[str, typer.Option(help="comma-separated policies")] = "static,dynamic,continuous,chunked_prefill",
    requests: Annotated[int, typer.Option(min=2, help="requests in the workload")] = 60,
    rate: Annotated[float, typer.Option(min=0.01, help="Poisson arrival rate, requests/s (keep the executor well below saturation, where queueing amplifies any step-time error)")] = 4.0,
    seed: Annotated[int, typer.Option(min=0, help="workload seed")] = 0,
    repeats: Annotated[int, typer.Option(min=1, help="executor runs per policy (metrics: their median)")] = 1,
    step_repeats: Annotated[int, typer.Option(min=1, help="runs of each executed step; it costs the median run")] = 3,
    p50_tol: Annotated[Optional[float], typer.Option(min=0.0, help="tolerance on TTFT/TPOT p50 (default 0.15 cpu, 0.10 gpu; with --bench 0.10)")] = None,
    p99_tol: Annotated[Optional[float], typer.Option(min=0.0, help="tolerance on TTFT/TPOT p99 (default 0.25, batchsim.app.validate.TOL_P99; with --replay, the recorded one)")] = None,
    threads: ThreadsOpt = 1,
    graphs: GraphsOpt = None,
    replay: Annotated[Optional[Path], typer.Option(help="compare with the executor runs recorded in this validate output folder instead of running the executor (no device, no torch; the workload, model and policies are those recorded)")] = None,
    bench: Annotated[Optional[list[Path]], typer.Option("--bench", help="compare with a real engine's benchmark output instead (repeatable; the formats of calibrate --from-bench): its own requests through the simulator with --profile")] = None,
    tp: Annotated[Optional[int], typer.Option(min=1, help="with --bench: tensor-parallel size of the benchmarked deployment (default: the one --profile was fitted with, else 1)")] = None,
    engine_preset: Annotated[Optional[str], typer.Option(help="with --bench: the engine's preset ('none': the policy options alone; default: the one --profile was fitted with, else vllm-v1)")] = None,
    policy_set: Annotated[Optional[list[str]], typer.Option("--policy-set", help="with --bench: KEY=VALUE over the preset's policy knobs (default: those --profile was fitted with)")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="with --bench: weight dtype of the benchmarked model (default: the one --profile was fitted with, else bf16)")] = None,
) -> None:
    """Run one workload through the reference executor and the simulator per policy; compare.
    With --bench: replay a real engine's benchmark through the simulator and compare."""
    from rich.console import Console
    from rich.table import Table

    from batchsim.app.validate import write_validation

    if bench:
        from batchsim.app.bench_fit import load_runs, validate_bench, write_report

        import math
        from dataclasses import MISSING, fields

        from batchsim.app.bench_fit import BenchSetup
        from batchsim.calibrate.hardware import load_hardware

        console = Console(width=None if Console().is_terminal else 120, highlight=False)
        # (the deployment calibrate --from-bench fitted the profile on, where an option does not say)
        fitted = ((load_hardware(str(profile)).provenance or {}).get("from_bench") or {})
        given = {"model": model, "tensor_parallel_size": tp, "engine_preset": engine_preset,
                 "policy": _policy_keys(policy_set, "--policy-set") if policy_set else None, "dtype": dtype}
        # (and otherwise what a BenchSetup takes when nothing says)
        shipped = {f.name: f.default_factory() if f.default_factory is not MISSING else f.default
                   for f in fields(BenchSetup) if f.default is not MISSING or f.default_factory is not MISSING}
        used, origin = {}, []
        for key, value in given.items():
            if value is not None:
                used[key] = value
                if fitted.get(key) is not None and fitted[key] != value:
                    console.print(f"note: {profile} was fitted with {key} {fitted[key]!r}; this replay uses "
                                  f"{value!r} (the option)")
            elif fitted.get(key) is not None or (key == "engine_preset" and "engine_preset" in fitted):
                used[key] = fitted.get(key)
                origin.append(key)
            else:
                used[key] = shipped.get(key)
        runs = load_runs(bench)
        setup, model_note = _bench_setup([used["model"]] if used["model"] else None, str(profile),
                                         used["tensor_parallel_size"], used["dtype"],
                                         used["engine_preset"] or "none", used["policy"] or {}, runs, "--profile")
        if origin:
            console.print(f"from {profile}'s calibration: " + ", ".join(f"{k} {used[k]!r}" for k in origin))
        if model_note and "model" not in origin:
            console.print(model_note)
        bar, tick = _progress("replaying")
        with bar:
            rows = validate_bench(runs, setup, str(profile), progress=tick)
        files = write_report(rows, out, f"validate --bench: {setup.model} with {profile}",
                             {"deployment": {"model": setup.model, "tensor_parallel_size": setup.tensor_parallel_size,
                                             "dtype": setup.dtype, "engine_preset": setup.engine_preset,
                                             "policy": setup.policy, "profile": str(profile)}})
        console.print(_bench_table(rows, f"{setup.model} with {profile}: measured vs simulated"))
        console.print(f"written: {', '.join(str(f) for f in files.values())}")
        tol = BENCH_P50_TOL if p50_tol is None else p50_tol
        p50 = [r for r in rows if r["percentile"] == "p50" and r["metric"] in ("ttft", "tpot")]
        # (a metric the benchmark has no value of, such as the TPOT of one-token outputs, is not compared)
        none = [r for r in p50 if not math.isfinite(r["measured_ms"])]
        bad = [r for r in p50 if math.isfinite(r["measured_ms"]) and not abs(r["rel_error"]) <= tol]
        if none:
            console.print(f"note: {len(none)} TTFT/TPOT p50 without a measured value (e.g. TPOT of one-token "
                          "outputs): not compared")
        if bad:
            console.print(f"[bold red]FAILED[/]: {len(bad)} TTFT/TPOT p50 errors over {tol:.0%}")
            raise typer.Exit(1)
        console.print(f"[green]OK[/]: every TTFT/TPOT p50 within {tol:.0%}")
        return

    if replay is not None:
        from batchsim.app.validate import replay as replay_runs

        if Path(out).resolve() == Path(replay).resolve():
            from batchsim.sim.errors import InputError

            raise InputError("--out must differ from the --replay folder (it would overwrite the recorded runs)",
                             "--out")
        v = replay_runs(replay, profile, tol_p50=p50_tol, tol_p99=p99_tol)
    else:
        _need_torch()
        from batchsim.app.validate import TOL_P99, validate

        bar, tick = _progress("validating")
        with bar:
            v = validate(device, profile, model=model,
                         policies=[p.strip() for p in policies.split(",") if p.strip()], requests=requests,
                         rate=rate, seed=seed, repeats=repeats, step_repeats=step_repeats, threads=threads or None,
                         tol_p50=p50_tol, tol_p99=TOL_P99 if p99_tol is None else p99_tol, progress=tick,
                         graphs=graphs)
    files = write_validation(v, out)
    table = Table(title=f"{v.meta['model']} on {v.meta['device_name']}: simulated vs measured (ms)")
    for col in ("policy", "metric", "measured", "simulated", "error", "tolerance", ""):
        table.add_column(col, justify="right" if col in ("measured", "simulated", "error", "tolerance") else "left")
    for r in v.rows:
        tol = "-" if r["tolerance"] is None else f"{r['tolerance']:.0%}"
        table.add_row(r["policy"], f"{r['metric']} {r['percentile']}", f"{r['measured_ms']:.2f}",
                      f"{r['simulated_ms']:.2f}", f"{r['rel_error']:+.1%}", tol, "ok" if r["ok"] else "FAIL")
    console = Console(width=None if Console().is_terminal else 120, highlight=False)
    console.print(table)
    for p, s in v.steps.items():
        modes = ", ".join(f"{n} {m}" for m, n in s.get("modes", {}).items())
        console.print(f"{p}: {s['steps']} steps ({modes}), median |step-time error| {s['median_abs_error']:.1%}, "
                      f"total {s['total_error']:+.1%}")
    g = v.meta.get("executor_steps")
    if g and g.get("capture_error"):
        console.print(f"[bold red]CUDA graph capture failed[/] (steps ran uncaptured): {g['capture_error']}")
    if g and g["capture"]:
        console.print(f"CUDA graphs: {g['captured_at_warm_up']} captured at warm-up, {g['captured']} in all "
                      f"({g['capture_s']:.1f} s); timed steps that captured: {g['steps'].get('capture', 0)}")
    console.print(f"written: {', '.join(str(f) for f in files.values())}")
    if not v.passed:
        console.print("[bold red]FAILED[/]: an error exceeds its tolerance")
        raise typer.Exit(1)
    console.print("[green]OK[/]: every TTFT/TPOT error within tolerance")


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` and ``validate`` to the ``batchsim`` app."""
    app.command("calibrate")(calibrate_command)
    app.command("validate")(validate_command)
