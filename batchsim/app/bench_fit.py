"""Bring the simulator to the user's own engine: fit overhead terms from its benchmark, then check.

``batchsim calibrate --from-bench FILE...`` and ``batchsim validate --bench FILE`` read real
benchmark output (``vllm bench serve --save-result --save-detailed`` JSON, SGLang bench_serving's
``--output-details`` JSONL, GuideLLM's ``benchmarks.json``, genai-perf's ``profile_export.json``:
batchsim.calibrate.bench) and replay
each benchmark's own requests through the simulator: the same prompt and output lengths, in the
same order, sent at the same times (a rate or trace benchmark) or by the same number of
closed-loop clients (a concurrency benchmark).

**What is fitted**, and how. Four overhead terms the hardware profile's cost model leaves to the
engine (batchsim.calibrate.hardware.HostOverhead, FrontendOverhead):

- per step ``host.per_step_us`` and per row ``host.per_seq_us``: a request's TPOT is its decode
  steps' times over its tokens, so ``tpot_measured - tpot_simulated`` of request ``i`` is, to first
  order, ``s_i * (per_step + per_seq * rows_i)`` where ``s_i`` is its steps per token and
  ``rows_i`` the mean rows of those steps;
- per request ``frontend.per_request_us`` and per prompt token ``frontend.per_prompt_token_us``:
  ``ttft_measured - ttft_simulated`` is, to first order, ``k_i * per_request + p_i *
  per_prompt_token``, where ``k_i`` and ``p_i`` count the requests and prompt tokens the
  frontend served in its busy period up to request ``i`` (1 and ``prompt_i`` when it waited for
  no one). A constant delay on the way out (detokenize, stream) adds to TTFT and E2E exactly as
  one on the way in, so it is fitted into ``per_request_us``.

Each round simulates every fitted benchmark with the current terms, regresses the per-request
residuals (least squares over requests, after dropping residuals beyond 5 MADs of the median:
the tails of queueing), adds the corrections (host ones damped by RELAX) and repeats until no term moves by more
than TOLERANCE (0.2%) in a round, or
for :data:`ROUNDS` rounds. Higher-order effects (longer steps mean longer queues) are what the
later rounds absorb. Nothing here is fitted to anything but the user's files.

**Held out**: with two benchmarks or more, every other one (by file, then load) is held out of
the fit and predicted; the report gives measured against simulated TTFT, TPOT, ITL and E2E at
p50 and p99 for every benchmark, marked ``fit`` or ``held-out``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from batchsim.calibrate.bench import METRICS, BenchRun, read_bench
from batchsim.sim.errors import InputError

__all__ = ["BenchSetup", "BenchFit", "replay", "fit_bench", "validate_bench", "bench_model", "catalog_model", "ROUNDS",
           "FITTED_TERMS"]

ROUNDS = 20
# NOTE: corrections are damped: longer host time per step puts more rows in each step at the same load,
# which the next round's regressors see, so full corrections overshoot (they alternated on the tests).
RELAX = 0.6
TOLERANCE = 0.002  # stop when no term moved more than this (relative) in a round
FITTED_TERMS = ("host.per_step_us", "host.per_seq_us", "frontend.per_request_us", "frontend.per_prompt_token_us")
PERCENTILES = (50, 99)


@dataclass(frozen=True)
class BenchSetup:
    """The deployment the benchmark ran on, in batchsim's words."""

    model: str
    hardware: str  # a profile name or path
    tensor_parallel_size: int = 1
    dtype: str = "bf16"
    engine_preset: str | None = "vllm-v1"
    policy: dict = field(default_factory=dict)  # keys over the preset's
    seed: int = 0


def _scenario(setup: BenchSetup, run: BenchRun, terms: dict | None, hardware: str | None = None):
    from batchsim.app.config import scenario_from_dict

    raw: dict[str, Any] = {
        "name": f"bench-{run.label}", "model": setup.model, "hardware": hardware or setup.hardware,
        "tensor_parallel_size": setup.tensor_parallel_size, "dtype": setup.dtype, "seed": setup.seed,
        "workload": {"num_requests": max(1, len(run))},
    }
    if setup.engine_preset:
        raw["engine_preset"] = setup.engine_preset
    if setup.policy:
        raw["policy"] = dict(setup.policy)
    if terms:
        raw["overheads"] = terms
    return scenario_from_dict(raw, f"{run.source} [{run.label}]")


def _workload(run: BenchRun):
    from batchsim.sim.types import ClosedLoop, Workload

    n = len(run)
    prompt = np.maximum(run.input_tokens.astype(np.int64), 1)
    output = np.maximum(run.output_tokens.astype(np.int64), 1)
    if run.mode == "concurrency":
        return Workload(arrival=np.zeros(n), prompt_tokens=prompt, output_tokens=output,
                        closed=ClosedLoop(concurrency=int(run.concurrency), think_s=np.zeros(n)))
    return Workload(arrival=run.start.astype(np.float64), prompt_tokens=prompt, output_tokens=output)


def replay(run: BenchRun, setup: BenchSetup, terms: dict | None = None, hardware: str | None = None):
    """The simulator's run of ``run``'s requests on ``setup`` with overhead ``terms`` (scenario
    ``overheads`` form); returns batchsim.app.runner.RunResult."""
    from batchsim.app.runner import build_parts, simulate

    if not len(run):
        raise InputError("no successful requests to replay", f"{run.source} [{run.label}]")
    sc = _scenario(setup, run, terms, hardware)
    result = simulate(sc, build_parts(sc, workload=_workload(run)))
    status = result.requests["status"]
    if (status != "completed").any():
        bad = result.requests[status != "completed"]
        why = bad["reason"].iloc[0] or "unfinished"
        raise InputError(f"the simulator does not complete {len(bad)} of the benchmark's {len(run)} requests "
                         f"(the file's request {run.file_row(int(bad['rid'].iloc[0]))}, "
                         f"{int(run.input_tokens[int(bad['rid'].iloc[0])])} prompt tokens: {why}), so measured and "
                         "simulated would count "
                         "different requests; check --model, --tp and the policy keys against the benchmarked "
                         "server", f"{run.source} [{run.label}]")
    return result


def _in_server_slopes(req: pd.DataFrame, values: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Per request, the derivatives of its frontend-in delay by ``per_request_us`` and by
    ``per_prompt_token_us``: the requests, and their prompt tokens, that the frontend served in its
    busy period up to and including this one (batchsim.sim.frontend.tokenized_at's queue)."""
    n = len(req)
    prompt = req["prompt_tokens"].to_numpy(dtype=np.float64)
    if "frontend_in_s" not in req.columns:
        return np.ones(n), prompt
    fe = _terms(values)["frontend"]  # (the terms the replay ran with)
    own = (fe.get("per_request_us", 0.0) + fe.get("per_prompt_token_us", 0.0) * prompt) * 1e-6
    order = np.argsort(req["arrival"].to_numpy(), kind="stable")
    waited = (req["frontend_in_s"].to_numpy() - own)[order] > 1e-7  # (0.1 us: more than rounding)
    k, p = np.empty(n), np.empty(n)
    count = tokens = 0.0
    for j, i in enumerate(order.tolist()):
        if not waited[j]:
            count = tokens = 0.0
        count += 1.0
        tokens += prompt[i]
        k[i], p[i] = count, tokens
    return k, p


def _per_request(result, run: BenchRun, values: dict[str, float]) -> pd.DataFrame:
    """Measured and simulated per-request TTFT and TPOT side by side, with the regressors."""
    req = result.requests.sort_values("rid").reset_index(drop=True)
    if len(req) != len(run):
        raise RuntimeError(f"replay of {run.label} recorded {len(req)} of {len(run)} requests")
    k, p = _in_server_slopes(req, values)
    df = pd.DataFrame({"prompt": run.input_tokens, "output": run.output_tokens,
                       "ttft_m": run.ttft, "tpot_m": run.tpot, "in_k": k, "in_p": p,
                       "ttft_s": req["ttft"].to_numpy(), "tpot_s": req["tpot"].to_numpy()})
    # each request's decode steps: its replica's steps ending after its first token, up to its completion
    steps = result.steps
    n_steps = np.zeros(len(req))
    rows = np.zeros(len(req))
    for rep, grp in steps.groupby("replica", sort=True):
        end = grp["end"].to_numpy()
        order = np.argsort(end, kind="stable")
        end = end[order]
        cum = np.concatenate([[0.0], np.cumsum(grp["num_seqs"].to_numpy()[order], dtype=np.float64)])
        mine = (req["replica"].to_numpy() == rep) & req["completion"].notna().to_numpy()
        lo = np.searchsorted(end, req["first_token"].to_numpy()[mine], "right")
        hi = np.searchsorted(end, req["completion"].to_numpy()[mine], "right")
        n_steps[mine] = hi - lo
        rows[mine] = cum[hi] - cum[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        df["s"] = np.where(df["output"] > 1, n_steps / (df["output"] - 1), np.nan)
        df["rows"] = np.where(n_steps > 0, rows / n_steps, np.nan)
    return df


def _robust_lstsq(X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Least squares after dropping residuals beyond 5 MADs; with ``groups`` (a benchmark per row),
    each row weighted by its benchmark's residual spread (1 / MAD^2): a lightly loaded benchmark,
    whose requests meet an idle engine, says more per request than a queueing one."""
    ok = np.isfinite(y) & np.isfinite(X).all(axis=1)
    X, y = X[ok], y[ok]
    if groups is not None:
        groups = groups[ok]
        w = np.ones(len(y))
        for g in np.unique(groups):
            at = groups == g
            r = y[at]
            mad = np.median(np.abs(r - np.median(r)))
            w[at] = 1.0 / max(mad, 1e-6) ** 2  # (1 us floor: exact replays)
        sw = np.sqrt(w)
        return _robust_lstsq(X * sw[:, None], y * sw)
    if len(y) < X.shape[1] + 1:
        return np.zeros(X.shape[1])
    med = np.median(y)
    mad = np.median(np.abs(y - med)) or np.std(y) or 1.0
    keep = np.abs(y - med) <= 5 * 1.4826 * mad
    if keep.sum() >= X.shape[1] + 1:
        X, y = X[keep], y[keep]
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return coef


def _collinear(X: np.ndarray) -> bool:
    """Whether the columns of ``X`` (its finite rows) are proportional, to rounding: one term's
    regressor is a multiple of the other's, so the data fix their sum, not each."""
    X = X[np.isfinite(X).all(axis=1)]
    norms = np.linalg.norm(X, axis=0)
    if len(X) < 2 or not norms.all():
        return True
    sv = np.linalg.svd(X / norms, compute_uv=False)
    return bool(sv[-1] <= 1e-9 * sv[0])


def _terms(values: dict[str, float]) -> dict:
    out: dict[str, dict[str, float]] = {"host": {}, "frontend": {}}
    for k, v in values.items():
        part, name = k.split(".")
        out[part][name] = round(max(0.0, v), 3)
    return out


@dataclass
class BenchFit:
    """What ``calibrate --from-bench`` found: the terms, the rounds, and the per-benchmark table."""

    terms: dict[str, float]  # FITTED_TERMS -> microseconds
    rounds: list[dict]  # the terms after each round
    rows: list[dict]  # per benchmark x metric x percentile: measured, simulated, error, split
    runs: list[dict]  # per benchmark: source, label, mode, requests, split
    profile: Any = None  # the hardware profile with the fitted terms
    setup: BenchSetup | None = None
    files: list[dict] = field(default_factory=list)  # source path and sha256
    unfitted: list[str] = field(default_factory=list)  # terms the benchmarks said nothing about (the profile's kept)
    unfitted_why: dict[str, str] = field(default_factory=dict)
    pinned: list[str] = field(default_factory=list)  # terms held at 0 that the last round wanted below it
    frontend_on: list[str] = field(default_factory=list)  # the benchmarks the frontend terms were fitted on

    @property
    def converged(self) -> bool:
        return not (len(self.rounds) >= ROUNDS and self.rounds and self.rounds[-1]["change"] > TOLERANCE)


def _split(runs: Sequence[BenchRun], fit_on: Sequence[str] | None) -> list[bool]:
    """Which benchmarks are fitted (True) and which held out."""
    if fit_on:
        def names(r: BenchRun) -> set[str]:  # (a label load_runs made unique still answers to its own)
            return {r.label, r.label.split(" [")[0].split(" #")[0], Path(r.source).name}

        known = set().union(*map(names, runs))
        unknown = [f for f in fit_on if f not in known]
        if unknown:
            raise InputError(f"no benchmark is labelled or named {', '.join(map(repr, unknown))}; labels: "
                             f"{', '.join(dict.fromkeys(r.label for r in runs))}", "--fit-on")
        return [bool(names(r) & set(fit_on)) for r in runs]
    if len(runs) < 2:
        return [True] * len(runs)
    return [i % 2 == 0 for i in range(len(runs))]


def _rows(run: BenchRun, result, split: str) -> list[dict]:
    from batchsim.calibrate.bench import run_from_records

    sim = run_from_records(result.requests, result.itl.frame(), label=run.label, mode=run.mode,
                           rate=run.rate, concurrency=run.concurrency)
    if run.format == "guidellm":  # (its report keeps one mean gap per request: compare like for like)
        sim = sim.with_mean_gaps()
    out = []
    for metric in METRICS:
        m, s = run.percentiles(metric, PERCENTILES), sim.percentiles(metric, PERCENTILES)
        for p in PERCENTILES:
            key = f"p{p}"
            meas, simv = m[key], s[key]
            err = simv / meas - 1 if meas and math.isfinite(meas) and math.isfinite(simv) else float("nan")
            out.append({"source": run.source, "label": run.label, "split": split, "metric": metric,
                        "percentile": key, "measured_ms": meas * 1e3, "simulated_ms": simv * 1e3,
                        "rel_error": err})
    return out


def catalog_model(model_id: str | None) -> str | None:
    """The catalog model a benchmark's model id names, if any: the id's last path part, lower-cased,
    ``meta-`` dropped, then its longest dash-separated prefix that is a catalog name
    (``meta-llama/Llama-3.1-70B-Instruct`` -> ``llama-3.1-70b``, ``Mistral-7B-Instruct-v0.3`` ->
    ``mistral-7b``)."""
    from batchsim.calibrate.models import model_names

    if not model_id:
        return None
    base = str(model_id).rstrip("/").split("/")[-1].lower().removeprefix("meta-")
    names = set(model_names())
    parts = base.split("-")
    for k in range(len(parts), 1, -1):
        if "-".join(parts[:k]) in names:
            return "-".join(parts[:k])
    return None


def bench_model(runs: Sequence[BenchRun], given: str | None) -> tuple[str, str | None]:
    """(the model to replay, a note for the user or None): ``given`` (``--model``) when set, with a
    note if the files name another catalog model; else the one catalog model the files name."""
    ids = list(dict.fromkeys(r.model for r in runs if r.model))
    models = {i: catalog_model(i) for i in ids}
    named = list(dict.fromkeys(m for m in models.values() if m))
    if given:
        other = [m for m in named if m != given]
        note = (f"note: the benchmark files name {', '.join(ids)}, but --model is {given}; the replay uses {given}"
                if other else None)
        return given, note
    # (ids the catalog does not know count as models of their own: two files, two models)
    if len(set(models[i] or i for i in ids)) > 1:
        raise InputError(f"the benchmark files name several models ({', '.join(ids)}); give --model, and fit one "
                         "model's benchmarks at a time", "--model")
    if named:
        quant = next((q for q in ("fp8", "int8", "int4", "awq", "gptq", "w8a8", "w4a16") if q in ids[0].lower()), None)
        return named[0], (f"model {named[0]} (from the benchmark files' model {ids[0]})"
                          + (f"; its id names {quant} weights: give --dtype to match" if quant else ""))
    if ids:
        raise InputError(f"the benchmark files name model {ids[0]!r}, which is not in batchsim's catalog; give "
                         "--model NAME (batchsim catalog) or --model PATH (its config.json)", "--model")
    raise InputError("the benchmark files name no model; give --model NAME (batchsim catalog) or --model PATH "
                     "(its config.json)", "--model")


def _sha(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def load_runs(files: Sequence[str | Path], distinct: bool = False) -> list[BenchRun]:
    """Every benchmark in ``files``, each with a label of its own: a label two benchmarks share (the
    same rate in two files, or twice in one --append-result file) gains the file's name, then its
    place among them (``rate=4.0 [b.json]``, ``rate=4.0 #2``)."""
    import dataclasses

    runs: list[BenchRun] = []
    seen_sha: dict[str, str] = {}
    for f in files:
        sha = _sha(str(f))
        if distinct and sha and sha in seen_sha:  # (calibrate: the same benchmark twice would be "held out" of itself)
            raise InputError(f"has the same contents as {seen_sha[sha]}; expected each benchmark once (a "
                             "benchmark held out must be one the fit did not see)", str(f))
        seen_sha[sha] = str(f)
        runs.extend(read_bench(f))
    if not runs:
        raise InputError("no benchmarks in the files given", "--from-bench")
    for attempt in (lambda r, k: f"{r.label} [{Path(r.source).name}]", lambda r, k: f"{r.label} #{k + 1}"):
        labels = [r.label for r in runs]
        if len(set(labels)) == len(labels):
            break
        seen: dict[str, int] = {}
        for i, r in enumerate(runs):
            if labels.count(r.label) > 1:
                k = seen.get(r.label, 0)
                seen[r.label] = k + 1
                runs[i] = dataclasses.replace(r, label=attempt(r, k))
    return runs


def fit_bench(runs: Sequence[BenchRun], setup: BenchSetup, fit_on: Sequence[str] | None = None,
              progress: Callable[[int, int, str], None] | None = None, name: str | None = None) -> BenchFit:
    """Fit :data:`FITTED_TERMS` on the chosen benchmarks, then predict every benchmark."""
    from batchsim.app.runner import _hardware, build_cost

    fitted = _split(runs, fit_on)
    base = build_cost(_scenario(setup, runs[0], None)).hardware
    values = {"host.per_step_us": base.host_overhead.per_step_us, "host.per_seq_us": base.host_overhead.per_seq_us,
              "frontend.per_request_us": base.frontend.per_request_us,
              "frontend.per_prompt_token_us": base.frontend.per_prompt_token_us}
    rounds = []
    unfitted: set[str] = set()
    notes: dict[str, str] = {}  # term -> why it was not fitted
    pinned: list[str] = []  # terms the last round wanted below 0
    # NOTE: a closed loop's TTFT barely moves with the frontend terms (its clients send at a step's
    # end and wait for the next step anyway), so its residuals, small and tight, would outweigh the
    # open-loop ones that do measure the frontend: fit the frontend on open loops whenever there are any.
    open_loop = any(f and r.mode != "concurrency" for r, f in zip(runs, fitted))
    on_frontend = [f and not (open_loop and r.mode == "concurrency") for r, f in zip(runs, fitted)]
    total = ROUNDS * (sum(fitted) + sum(on_frontend)) + len(runs)
    done = 0
    for k in range(ROUNDS):
        # NOTE: one half-round per pair of terms (Gauss-Seidel): the host terms move TTFT too (prefill
        # steps, queueing), so the frontend terms are fitted on a simulation that has the new host terms.
        old = dict(values)
        pinned = []
        for half in ("host", "frontend"):
            frames = []
            for run, fit in zip(runs, on_frontend if half == "frontend" else fitted):
                if not fit:
                    continue
                frames.append(_per_request(replay(run, setup, _terms(values)), run, values).assign(run=len(frames)))
                done += 1
                if progress:
                    progress(done, total, f"round {k + 1} ({half}): {run.label}")
            df = pd.concat(frames, ignore_index=True)
            if half == "host":  # TPOT: residual = s * (d_step + d_seq * rows)
                X = np.column_stack([df["s"], df["s"] * df["rows"]])
                y = (df["tpot_m"] - df["tpot_s"]).to_numpy()
                if not (np.isfinite(y) & np.isfinite(X).all(axis=1)).sum() >= 3:
                    multi = int((df["output"] > 1).sum())
                    for t in ("host.per_step_us", "host.per_seq_us"):
                        unfitted.add(t)
                        notes[t] = ("no request of two tokens or more: nothing says what a decode step costs"
                                    if not multi else f"only {multi} request(s) of two tokens or more: too few "
                                    "to fit the decode-step terms (3 needed)")
                    continue
                d = _robust_lstsq(X, y) * 1e6
                keys = ("host.per_step_us", "host.per_seq_us")
            else:  # TTFT: residual = k * d_req + p * d_tok (k requests, p prompt tokens in its busy period)
                X = np.column_stack([df["in_k"].to_numpy(), df["in_p"].to_numpy()])
                y = (df["ttft_m"] - df["ttft_s"]).to_numpy()
                keys = ("frontend.per_request_us", "frontend.per_prompt_token_us")
                if not (np.isfinite(y) & np.isfinite(X).all(axis=1)).sum() >= 3:
                    for t in keys:
                        unfitted.add(t)
                        notes[t] = "fewer than 3 requests: too few to fit the frontend terms"
                    continue
                if _collinear(X):  # every prompt the same length: a per-token term is a per-request one
                    t = "frontend.per_prompt_token_us"
                    unfitted.add(t)
                    notes[t] = (f"every fitted request's prompt has {int(df['prompt'].iloc[0])} tokens, so a "
                                "per-token cost cannot be told from a per-request one: per_request_us holds both "
                                "(benchmark prompts of several lengths to separate them)")
                    d = np.append(_robust_lstsq(X[:, :1], y, df["run"].to_numpy()) * 1e6, 0.0)
                else:
                    d = _robust_lstsq(X, y, df["run"].to_numpy()) * 1e6
            relax = RELAX if half == "host" else 1.0  # (the frontend's slopes are its exact derivatives)
            for key, delta in zip(keys, d):
                if key in unfitted:
                    continue
                raw = float(values[key] + relax * delta)
                if raw < 0.0:
                    pinned.append(key)
                values[key] = max(0.0, raw)
        # (relative change, over at least 0.01 us: a term creeping up from 0 is not moving)
        change = max((abs(values[t] - old[t]) / max(abs(values[t]), 0.01) for t in FITTED_TERMS), default=0.0)
        rounds.append(dict(values, change=change))
        if change < TOLERANCE:
            break
    terms = _terms(values)
    rows, run_info = [], []
    for run, fit in zip(runs, fitted):
        split = "fit" if fit else "held-out"
        rows.extend(_rows(run, replay(run, setup, terms), split))
        run_info.append({"source": run.source, "label": run.label, "mode": run.mode, "requests": len(run),
                         "failed": run.failed, "split": split})
        done += 1
        if progress:
            progress(done, total, f"predict {run.label}")
    files = [{"path": s, "sha256": _sha(s)} for s in dict.fromkeys(r.source for r in runs)]
    fit = BenchFit(terms={t: round(values[t], 3) for t in FITTED_TERMS if t not in unfitted}, rounds=rounds,
                   rows=rows, runs=run_info, setup=setup, files=files, unfitted=sorted(unfitted),
                   unfitted_why={t: notes[t] for t in sorted(unfitted)}, pinned=sorted(set(pinned) - unfitted),
                   frontend_on=[r.label for r, f in zip(runs, on_frontend) if f])
    fit.profile = _profile(_hardware(_scenario(setup, runs[0], terms)), fit, name)
    return fit


def _profile(hw, fit: BenchFit, name: str | None):
    """The hardware profile with the fitted terms, and where they came from."""
    data = hw.model_dump(mode="json")
    data["name"] = name or f"{hw.name}-{fit.setup.engine_preset or 'bench'}"
    prov = dict(data.get("provenance") or {})
    held = [r for r in fit.rows if r["split"] == "held-out" and r["percentile"] == "p50"
            and r["metric"] in ("ttft", "tpot") and math.isfinite(r["rel_error"])]
    prov["from_bench"] = {
        "files": fit.files, "benchmarks": fit.runs, "fitted": [t for t in FITTED_TERMS if t not in fit.unfitted],
        "not_fitted": fit.unfitted, "not_fitted_why": fit.unfitted_why, "pinned_at_zero": fit.pinned,
        "terms_us": fit.terms, "dtype": fit.setup.dtype,
        "rounds": len(fit.rounds),
        "converged": fit.converged,
        "model": fit.setup.model, "tensor_parallel_size": fit.setup.tensor_parallel_size,
        # (the device the chain of calibrations started from: a profile fitted again keeps it, so the
        # presets' rules by device still see it whatever --name the profiles took)
        "engine_preset": fit.setup.engine_preset, "policy": fit.setup.policy,
        "base_profile": ((hw.provenance or {}).get("from_bench") or {}).get("base_profile") or hw.name,
        "held_out_p50_abs_error_max": max((abs(r["rel_error"]) for r in held), default=None),
        "method": "batchsim.app.bench_fit: per-request TTFT and TPOT residual regressions, iterated",
    }
    fitted = (f"fitted by batchsim calibrate --from-bench on {len(fit.files)} file(s) of the user's engine "
              "(provenance.from_bench)")
    def said(terms: tuple[str, ...]) -> str:
        names = " and ".join(t.split(".")[1] for t in terms)
        kept = [t for t in terms if t in fit.unfitted]
        if not kept:
            return f"{names} {fitted}"
        got = [t.split(".")[1] for t in terms if t not in fit.unfitted]
        return ((f"{' and '.join(got)} {fitted}; " if got else "")
                + "; ".join(f"{t.split('.')[1]} from {hw.name} ({fit.unfitted_why.get(t, 'not fitted')})"
                            for t in kept))

    prov["host_overhead"] = (f"{said(('host.per_step_us', 'host.per_seq_us'))}; per_decode_step_us and "
                             f"per_tp_rank_us from {hw.name}")
    prov["frontend"] = (f"{said(('frontend.per_request_us', 'frontend.per_prompt_token_us'))}; "
                        f"per_step_us and per_output_token_us from {hw.name} (a constant delay out is fitted into "
                        "per_request_us)")
    data["provenance"] = prov
    return type(hw).model_validate(data)


def validate_bench(runs: Sequence[BenchRun], setup: BenchSetup, profile: str,
                   progress: Callable[[int, int, str], None] | None = None) -> list[dict]:
    """Every benchmark through the simulator with ``profile``: measured vs simulated rows."""
    rows = []
    for i, run in enumerate(runs):
        rows.extend(_rows(run, replay(run, setup, None, hardware=profile), "validate"))
        if progress:
            progress(i + 1, len(runs), run.label)
    return rows


def _no_nan(v: Any) -> Any:
    """``v`` with every non-finite float as None (JSON's null: a metric with no value, such as the
    TPOT of one-token outputs)."""
    if isinstance(v, dict):
        return {k: _no_nan(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_no_nan(x) for x in v]
    if isinstance(v, (float, np.floating)) and not math.isfinite(v):
        return None
    return v


def write_report(rows: list[dict], out: Path, title: str, extra: dict | None = None) -> dict[str, Path]:
    """``bench.csv``, ``bench.json`` and ``bench.png`` (measured vs simulated, by metric) as one set."""
    import json

    from batchsim.sim.io import write_set

    frame = pd.DataFrame(rows)

    def plot(path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = list(dict.fromkeys(frame["label"]))
        fig, axes = plt.subplots(2, len(METRICS), figsize=(3.2 * len(METRICS), 5.6), squeeze=False)
        for j, metric in enumerate(METRICS):
            for i, p in enumerate(("p50", "p99")):
                ax = axes[i][j]
                sub = frame[(frame["metric"] == metric) & (frame["percentile"] == p)].set_index("label").reindex(labels)
                x = np.arange(len(labels))
                ax.bar(x - 0.2, sub["measured_ms"], 0.4, label="measured")
                ax.bar(x + 0.2, sub["simulated_ms"], 0.4, label="simulated")
                ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=7)
                ax.set_title(f"{metric} {p} (ms)", fontsize=9)
        handles, names = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, names, loc="upper right", fontsize=8)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)

    writers = {"bench.csv": lambda p: frame.to_csv(p, index=False, float_format="%.6g"),
               "bench.json": lambda p: p.write_text(json.dumps(_no_nan({"title": title, "rows": rows, **(extra or {})}),
                                                               indent=2, default=float, allow_nan=False) + "\n"),
               "bench.png": plot}
    write_set(out, writers, {"written_by": "batchsim bench", "title": title})
    return {k: Path(out) / k for k in writers}
