"""The two device jobs: calibrate a profile, then validate the simulator against real steps.

:func:`calibrate_device` (``batchsim calibrate``) times the kernels of
:mod:`batchsim.calibrate.kernels` on a device in interleaved rounds, fits the profile
(:mod:`batchsim.calibrate.fit`), fits the host overhead to whole steps of the
reference executor and scores the held-out cases.

:func:`validate` (``batchsim validate``) runs one small seeded workload
through the reference executor (real steps, :mod:`batchsim.calibrate.executor`) and
through the simulator priced by the profile, for every policy, with the same
policy objects, configs and engine, and compares TTFT/TPOT/E2E percentiles
and step times. :func:`write_validation` writes validate.json, validate.csv,
validate.png and both runs' request records.
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from batchsim.calibrate.fit import Sample, fit_efficiency, fit_host, held_out_error, plan_steps, samples_of, step_size
from batchsim.calibrate.hardware import Efficiency, HardwareProfile, HostOverhead, load_hardware
from batchsim.calibrate.models import ModelSpec, load_model
from batchsim.sim.errors import InputError
from batchsim.sim.types import StepShape

__all__ = ["Calibration", "calibrate_device", "fit_calibration", "write_evidence", "read_evidence", "POLICIES",
           "Validation", "validate", "replay", "write_validation", "DEFAULT_MODELS", "METRICS", "TOL_P99"]

DEFAULT_MODELS = {"cpu": ("tiny-llama",), "cuda": ("llama-3-8b",)}
TOL_P99 = 0.25  # validate's default tolerance on TTFT/TPOT p99
Progress = Callable[[int, int, str], None]


@dataclass
class Calibration:
    """A fitted profile and the evidence behind it."""

    profile: HardwareProfile
    samples: list[Sample]
    held_out: dict
    host_steps: list[dict]
    seconds: float
    facts: dict = field(default_factory=dict)


class _Threads:
    """Pin torch's CPU threads for the duration (timings on a shared machine need it)."""

    def __init__(self, n: int | None) -> None:
        self.n = n

    def __enter__(self):
        import torch

        self.old = torch.get_num_threads()
        if self.n:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        import torch

        torch.set_num_threads(self.old)


def _measure(K, dev, dtype: str, specs: list[ModelSpec], quick: bool, rounds: int | None,
             tick: Progress, graphs: bool | None = None) -> tuple[list[Sample], dict]:
    """Peaks and launch latency, then every kernel of the plan's steps, timed in place, per model.

    The first model's whole steps (the host overhead's evidence) run through
    :meth:`ReferenceModel.step` with ``graphs`` as validation's do, so the profile is
    fitted on the code whose steps it then predicts; kernels are timed eagerly.
    """
    from batchsim.calibrate.executor import ReferenceModel
    from batchsim.calibrate.graphs import summary

    plan = plan_steps(dev.type, quick)
    rounds = rounds or (7 if quick else 15)
    total = 3 + len(specs) * (rounds + 1) * len(plan)
    cpu = dev.type == "cpu"
    facts = {"launch": K.launch_seconds(dev), "launch_on": "device" if dev.type == "cuda" else "host"}
    tick(1, total, "empty launches")
    facts["peak"] = K.peak_gemm_flops(dev, K.DTYPES[dtype], ([1024] if quick else [1024, 2048]) if cpu else [4096, 8192])
    tick(2, total, "peak GEMM")
    facts["bw"] = K.copy_bandwidth(dev, (64 << 20 if quick else 128 << 20) if cpu else 1 << 30)
    tick(3, total, "large copy")
    samples: list[Sample] = []
    for j, spec in enumerate(specs):
        done = 3 + j * (rounds + 1) * len(plan)
        # NOTE: only the first model's whole-step walls are used: the others run eager, sparing captures
        model = ReferenceModel(spec, dev, dtype, max_len=256, slots=8, graphs=graphs if j == 0 else False)
        walls, kernels = model.profile_steps([s for s, _ in plan], rounds, kernels=True, progress=lambda n, _: tick(
            done + n, total, f"{spec.name}: {rounds} rounds of {len(plan)} steps"))
        samples += samples_of(spec, plan, kernels, dtype)
        if j == 0:
            facts["steps"] = [(shape, held, wall) for (shape, held), wall in zip(plan, walls)]
            facts["step_modes"] = model.step_modes
            facts["graphs"] = summary(model, model.step_modes)
            if dev.type == "cuda":  # did the hold keep the device queued? (KernelTimer.idle_fraction)
                idle = np.array(model.device_idle)
                facts["device_idle"] = {"median": float(np.median(idle)), "p90": float(np.percentile(idle, 90)),
                                        "max": float(idle.max())}
        del model
    return samples, facts


def calibrate_device(device: str = "cpu", dtype: str = "bf16", quick: bool = False,
                     models: Sequence[str] | None = None, threads: int | None = 1, name: str | None = None,
                     progress: Progress | None = None, rounds: int | None = None,
                     graphs: bool | None = None) -> Calibration:
    """Time the kernels on ``device``, fit the profile and the host overhead, score held-out kernels.

    ``models`` give the shapes (default: tiny-llama on the CPU, llama-3-8b on
    a GPU); the first one's whole steps also fit the host overhead. ``threads``
    pins torch's CPU threads (None: leave as is). ``rounds``: timed rounds of
    the plan (default 15, 7 with ``quick``; CUDA events need fewer than a shared CPU).
    ``graphs``: the whole steps' pure decodes on the executor's graph path (default:
    on CUDA; see :class:`batchsim.calibrate.executor.ReferenceModel`).
    """
    from batchsim.calibrate import kernels as K

    start = time.perf_counter()
    dev = K.resolve_device(device)
    if dev.type == "cpu":
        K.keep_heap()
    if dtype not in ("bf16", "fp16"):
        raise InputError(f"unknown dtype {dtype!r}; choose bf16 or fp16", "--dtype")
    specs = [load_model(m) for m in (models or DEFAULT_MODELS[dev.type])]
    tick = progress or (lambda done, total, label: None)
    with _Threads(threads if dev.type == "cpu" else None):
        samples, f = _measure(K, dev, dtype, specs, quick, rounds, tick, graphs)
    f.update(device=K.device_name(dev), software=K.software_versions(dev), quick=quick, dtype=dtype,
             models=[m.name for m in specs], kind=dev.type, memory_gib=_memory_gib(dev),
             date=datetime.date.today().isoformat())
    return fit_calibration(samples, f, name, time.perf_counter() - start)


def _raised(samples: Sequence[Sample], f: dict) -> tuple[float, float]:
    """The peaks the curves are fractions of: the measured ones, raised to the best rate a timed
    kernel reached (launch time taken off), so that every fraction is <= 1.

    NOTE: a kernel near the launch floor leaves almost nothing once the launch is taken
    off, so its implied rate can be far above any real one: the H200 run of
    docs/validation.md raised 4.3 TB/s to 53 TB/s that way, its launch being timed on the
    host (7.2 us) and its kernels on the device (4 us the smallest). The curves are
    fitted as fractions of the raised figure, so predictions stay right; keeping only
    kernels over twice the launch time gave 11 TB/s and worse held-out errors (gemm
    3.8% against 2.5%, whole steps 10.2% against 7.5%). A GPU's launch is now timed on
    the device (:func:`batchsim.calibrate.kernels.launch_seconds`), which removes the cause.
    """
    t = [max(s.seconds - f["launch"], 0.05 * s.seconds) for s in samples]
    return (max(f["peak"], max(s.flops / x for s, x in zip(samples, t))),
            max(f["bw"], max(s.bytes / x for s, x in zip(samples, t))))


def as_run(shape: StepShape, mode: str | None) -> StepShape:
    """``shape`` as the reference executor ran it: a pure-decode step on its static layout (``mode``
    static, capture or graph: batchsim.calibrate.graphs) is padded to the capture size, and its
    projections, MLP and LM head compute the padding rows too (their attention reads one token)."""
    if not mode or not set(mode.split("+")) <= {"static", "capture", "graph"}:
        return shape
    from batchsim.calibrate.graphs import capture_size

    padded = capture_size(shape.num_rows)
    if padded is None or padded == shape.num_rows:
        return shape
    return StepShape(q=shape.q, kv=shape.kv, sampled=padded, dense_tokens=padded)


def fit_calibration(samples: list[Sample], f: dict, name: str | None = None, seconds: float = 0.0) -> Calibration:
    """Fit the profile to timed kernels and whole steps: the device-free half of a calibration.

    ``f`` holds the measured facts (``peak``, ``bw``, ``launch``, ``steps`` as
    (shape, held_out, seconds), ``device``, ``software``, ``dtype``, ``quick``,
    ``models``, ``kind``, ``memory_gib``, ``date``), as :func:`calibrate_device`
    measures them or :func:`read_evidence` reads them back. ``name`` defaults to
    one made from the device kind and name.
    """
    from batchsim.calibrate.costmodel import RooflineCostModel

    dtype = f["dtype"]
    spec = load_model(f["models"][0])
    f["P"], f["W"] = _raised(samples, f)
    eff = fit_efficiency(samples, f["P"], f["W"], f["launch"])
    profile = _assemble(name or _slug(f["kind"], f["device"]), eff, f, HostOverhead(per_step_us=0, per_seq_us=0),
                        f["memory_gib"])
    modes = f.get("step_modes") or [None] * len(f["steps"])  # (evidence from before the graph path: none)
    ran = [as_run(s, mode) for (s, _, _), mode in zip(f["steps"], modes)]
    train = [(shape, wall) for shape, (_, held, wall) in zip(ran, f["steps"]) if not held]
    cm = RooflineCostModel(spec, profile, dtype=dtype)
    host = fit_host([s for s, _ in train], [w for _, w in train], [cm.price(s).seconds for s, _ in train])
    profile = _assemble(profile.name, eff, f, host, profile.memory_gib)
    cm = RooflineCostModel(spec, profile, dtype=dtype)
    steps = [{"step": i, **dict(zip(("rows", "tokens", "context"), step_size(s))),
              "held_out": held, "measured_s": w, "predicted_s": cm.price(r).seconds,
              **({"mode": mode} if mode is not None else {})}
             for i, ((s, held, w), r, mode) in enumerate(zip(f["steps"], ran, modes))]
    held = held_out_error(profile, samples, dtype)
    held["steps"] = _step_error(steps)
    cal = dict(profile.provenance["calibration"], held_out_error=held)
    profile = profile.model_copy(update={"provenance": dict(profile.provenance, calibration=cal)})
    return Calibration(profile, samples, held, steps, seconds, facts=f)


_FACTS = ("peak", "bw", "launch", "device", "software", "dtype", "quick", "models", "kind", "memory_gib", "date")
_OPTIONAL_FACTS = ("launch_on", "device_idle", "graphs", "note")


def write_evidence(cal: Calibration, out: str | Path) -> dict[str, Path]:
    """The measurements behind a profile: kernels.csv (every timed kernel's median, with its
    work), steps.csv (whole steps of the first model, measured and predicted) and facts.json
    (peaks, launch, device, software), so a profile can be refitted (:func:`read_evidence`,
    ``batchsim calibrate --refit``) or audited without the device."""
    import pandas as pd

    from batchsim.sim.io import atomic_write_text, write_json

    out = Path(out)
    files = {"kernels.csv": out / "kernels.csv", "steps.csv": out / "steps.csv", "facts.json": out / "facts.json"}
    rows = [(s.case.model, s.case.kernel, *s.case.size, s.case.held_out, s.op_class, s.flops, s.bytes, s.tokens,
             s.seconds) for s in cal.samples]
    # NOTE: every digit (%.17g), not write_csv's 9: a refit must see the numbers the fit saw
    for name, df in (("kernels.csv", pd.DataFrame(rows, columns=list(_KERNEL_COLUMNS))),
                     ("steps.csv", pd.DataFrame(cal.host_steps))):
        atomic_write_text(files[name], df.to_csv(index=False, float_format="%.17g", lineterminator="\n"))
    write_json(files["facts.json"], {k: cal.facts[k] for k in _FACTS + _OPTIONAL_FACTS if k in cal.facts})
    return files


_KERNEL_COLUMNS = ("model", "kernel", "rows", "tokens", "context", "held_out", "op_class", "flops", "bytes",
                   "work_tokens", "seconds")


def _read_csv(path: Path, columns: Sequence[str]):
    """A CSV that has these columns, or InputError naming the file."""
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except (ValueError, OSError) as e:  # (pandas' EmptyDataError and ParserError are ValueErrors)
        raise InputError(f"unreadable CSV: {e}", str(path)) from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InputError(f"missing columns {missing}", str(path))
    return df


def _evidence_frame(path: Path, columns: Sequence[str], numeric: Sequence[str], positive: Sequence[str]):
    """A non-empty CSV with these columns, finite numbers in ``numeric``, > 0 in ``positive``."""
    import pandas as pd

    df = _read_csv(path, columns)
    if df.empty:
        raise InputError("no rows", str(path))
    for c in numeric:
        v = pd.to_numeric(df[c], errors="coerce")
        bad = ~np.isfinite(v.to_numpy(dtype=float)) | ((v <= 0).to_numpy() if c in positive else False)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{c} must be a finite number{' > 0' if c in positive else ''}, got {df[c].iloc[i]!r}",
                             f"{path}:{i + 2}")
        df[c] = v
    return df


def read_evidence(folder: str | Path) -> tuple[list[Sample], dict]:
    """Samples and facts written by :func:`write_evidence`, ready for :func:`fit_calibration`.

    The whole steps are the calibration plan's (:func:`batchsim.calibrate.fit.plan_steps` for the
    device kind and ``quick`` recorded in facts.json), matched by their ``step`` index and
    checked against the recorded rows, tokens, context and held-out flag.
    """
    import json

    from batchsim.calibrate.fit import PRESETS, Case

    folder = Path(folder)
    paths = {n: folder / n for n in ("kernels.csv", "steps.csv", "facts.json")}
    for n, p in paths.items():
        if not p.is_file():
            raise InputError(f"no {n} in the evidence folder (written by batchsim calibrate --evidence)", str(folder))
    where = str(paths["facts.json"])
    try:
        facts = json.loads(paths["facts.json"].read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise InputError(f"unreadable JSON: {e}", where) from None
    if not isinstance(facts, dict):
        raise InputError("expected a JSON object", where)
    missing = [c for c in _FACTS if c not in facts]
    if missing:
        raise InputError(f"lacks {', '.join(missing)}", where)
    for key in ("peak", "bw", "launch", "memory_gib"):
        v = facts[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise InputError(f"{key} must be a number > 0, got {v!r}", where)
    if (facts["kind"], facts["quick"]) not in PRESETS:
        raise InputError(f"kind/quick must be one of {sorted(PRESETS)}, got {(facts['kind'], facts['quick'])!r}",
                         where)
    if facts["dtype"] not in ("bf16", "fp16"):
        raise InputError(f"dtype must be bf16 or fp16, got {facts['dtype']!r}", where)
    if not isinstance(facts["models"], list) or not facts["models"]:
        raise InputError(f"models must be a non-empty list of model names, got {facts['models']!r}", where)
    load_model(str(facts["models"][0]))  # (an unknown model is an InputError naming it)
    for key in ("device", "date"):
        facts[key] = str(facts[key])
    k = _evidence_frame(paths["kernels.csv"], _KERNEL_COLUMNS,
                        ("rows", "tokens", "context", "flops", "bytes", "work_tokens", "seconds"), ("seconds",))
    st = _evidence_frame(paths["steps.csv"], ("step", "rows", "tokens", "context", "held_out", "measured_s"),
                         ("step", "rows", "tokens", "context", "measured_s"), ("measured_s",))
    samples = [Sample(Case(str(r.model), str(r.kernel), (int(r.rows), int(r.tokens), int(r.context)),
                           str(r.held_out) == "True"),
                      str(r.op_class), float(r.flops), float(r.bytes), float(r.work_tokens), float(r.seconds))
               for r in k.itertuples(index=False)]
    plan = plan_steps(facts["kind"], bool(facts["quick"]))
    steps = []
    for line, r in enumerate(st.itertuples(index=False), start=2):
        i = int(r.step)
        if not 0 <= i < len(plan):
            raise InputError(f"step {i} is not in the {facts['kind']} calibration plan ({len(plan)} steps)",
                             f"{paths['steps.csv']}:{line}")
        shape, held = plan[i]
        want = (*step_size(shape), held)
        got = (int(r.rows), int(r.tokens), int(r.context), str(r.held_out) == "True")
        if got != want:
            raise InputError(f"step {i} is (rows, tokens, context, held_out) = {got}, but the calibration plan's "
                             f"step {i} is {want}: evidence from another plan or facts.json's kind/quick is wrong",
                             f"{paths['steps.csv']}:{line}")
        steps.append((shape, held, float(r.measured_s)))
    facts["steps"] = steps
    if "mode" in st.columns:  # (how each whole step ran: eager, static, graph; absent in older evidence)
        facts["step_modes"] = [str(m) for m in st["mode"]]
    return samples, facts


def _step_error(steps: list[dict]) -> dict:
    """Median |predicted/measured - 1| of the held-out whole steps."""
    errs = [abs(s["predicted_s"] / s["measured_s"] - 1.0) for s in steps if s["held_out"]]
    return {"n": len(errs), "median": float(np.median(errs)) if errs else 0.0,
            "p90": float(np.percentile(errs, 90)) if errs else 0.0}


def _slug(kind: str, device: str) -> str:
    words = "".join(ch if ch.isalnum() else "-" for ch in device.lower()).split("-")
    skip = {"r", "tm", "cpu", "processor", "nvidia", "intel", "amd", "core"}
    return "-".join([kind] + [w for w in words if w and w not in skip])[:48]


def _memory_gib(dev) -> float:
    if dev.type == "cuda":
        import torch

        return torch.cuda.get_device_properties(dev).total_memory / 2**30
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def _assemble(name: str, eff: dict[str, Efficiency], f: dict, host: HostOverhead, memory_gib: float) -> HardwareProfile:
    """The profile, with a source for every figure."""
    from batchsim.calibrate.graphs import describe

    dt = f["dtype"]
    path = describe(f.get("graphs"))  # (evidence from before the graph path: eager, worded as it was then)
    steps = "eager PyTorch steps" if path == "eager PyTorch" else f"steps ({path})"

    def raised(measured: float, used: float, unit: str) -> str:
        if used <= measured * 1.0001:
            return ""
        return f" Raised to {used:.4g} {unit}, the highest rate a timed kernel reached, so every fraction is <= 1."
    prov = {
        "peak_tflops": f"measured: best {dt} rate of large square GEMMs on this device, {f['peak'] / 1e12:.4g} "
                       f"TFLOP/s (not a datasheet figure).{raised(f['peak'] / 1e12, f['P'] / 1e12, 'TFLOP/s')}",
        "memory": "measured: device memory reported by the system (RAM on the CPU).",
        "hbm_bandwidth": f"measured: large device copy (read + write), {f['bw'] / 1e9:.4g} GB/s."
                         f"{raised(f['bw'] / 1e9, f['W'] / 1e9, 'GB/s')}",
        "interconnect": "not measured: a placeholder; tensor-parallel predictions with this profile are uncalibrated.",
        "launch_latency": f"measured: median per-call time of empty one-element launches, {f['launch'] * 1e6:.3g} us"
                          f"{' (device time, back to back)' if f.get('launch_on') == 'device' else ''}.",
        "host_overhead": f"fitted: per-step, per-sequence and decode-step time of whole {f['models'][0]} steps "
                         f"(reference executor, {path}) beyond the sum of their kernels' predicted times.",
        "efficiency": "fitted by batchsim calibrate: per operator class (and per elementwise operator) compute and "
                      "memory curves, as fractions of the measured peaks above, minimising absolute log error over "
                      f"every kernel timed in place inside whole steps of {', '.join(f['models'])} (reference "
                      "executor); every other size and the o_proj GEMM shape are held out.",
        "calibration": {"device": f["device"], "software": f["software"], "dtype": dt, "quick": f["quick"],
                        "models": f["models"], "date": f["date"],
                        **({"device_idle_between_kernels": f["device_idle"]} if "device_idle" in f else {}),
                        **({"executor_steps": f["graphs"]} if "graphs" in f else {})},
    }
    return HardwareProfile(
        name=name, description=f"{f['device']} ({dt}), calibrated by batchsim: kernel times from this device, host "
                               f"overhead from the reference executor's {steps}", calibrated=True,
        peak_tflops={dt: round(f["P"] / 1e12, 6)}, memory_gib=round(memory_gib, 2),
        hbm_bandwidth_gbs=round(f["W"] / 1e9, 3),
        interconnect={"name": "none (not measured)", "bandwidth_gbs": 1.0, "latency_us": 0.0, "efficiency": 1.0},
        launch_latency_us=round(f["launch"] * 1e6, 3), host_overhead=host, memory_reserve_gib=0.5,
        efficiency=eff, provenance=prov)


# -- validation -------------------------------------------------------------------------
# One setting per policy, sized for a tiny model on a CPU: batches of 8, 16 running sequences.
POLICIES: dict[str, dict] = {
    "static": {"name": "static", "max_batch_size": 8},
    "dynamic": {"name": "dynamic", "max_batch_size": 8, "preferred_batch_sizes": [4, 8], "max_queue_delay_s": 0.05},
    "continuous": {"name": "continuous", "max_num_seqs": 16, "max_num_batched_tokens": 2048},
    "chunked_prefill": {"name": "chunked_prefill", "max_num_seqs": 16, "max_num_batched_tokens": 256},
}
METRICS = ("ttft", "tpot", "e2el")
_KEYS = {"p50": "median", "p99": "p99"}


@dataclass
class Validation:
    """Measured (executor) against simulated (profile) latencies, per policy."""

    meta: dict
    rows: list[dict]  # policy, metric, percentile, measured_ms, simulated_ms, rel_error, tolerance, ok
    steps: dict  # policy -> step-time error summary
    runs: dict = field(default_factory=dict)  # policy -> {"executor": [RunResult...], "simulator": RunResult}
    logs: dict = field(default_factory=dict)  # policy -> [StepRecord...] of the executor's timed runs

    @property
    def passed(self) -> bool:
        return all(r["ok"] for r in self.rows if r["tolerance"] is not None)


def _scenario(model: str, profile: str, dtype: str, policy: dict, requests: int, rate: float, seed: int):
    from batchsim.app.config import scenario_from_dict

    return scenario_from_dict({
        "name": f"validate-{policy['name']}", "model": model, "hardware": profile, "dtype": dtype,
        "policy": dict(policy, max_model_len=1024), "seed": seed, "workload": {
            "num_requests": requests, "arrival": {"process": "poisson", "rate": rate},
            "prompt_tokens": {"dist": "lognormal", "median": 96, "p90": 200, "max": 320, "min": 8},
            "output_tokens": {"dist": "lognormal", "median": 24, "p90": 48, "max": 64, "min": 2}}},
        "validation scenario")


def _executor_runs(scenario, parts, model, repeats: int, step_repeats: int) -> tuple[list, list]:
    """``repeats`` executor runs of one scenario; their results and step records."""
    from batchsim.calibrate.replica import ExecutorReplica
    from batchsim.app.runner import simulate

    results, log = [], []
    for _ in range(repeats):
        model.reset()
        gc.collect()
        gc.disable()  # NOTE: a collection inside a timed step would be billed to that step
        try:
            replica = partial(ExecutorReplica, model=model, log=log, repeats=step_repeats)
            results.append(simulate(scenario, parts, replica=replica))
        finally:
            gc.enable()
    return results, log


def _step_summary(log: list, executed: list) -> dict:
    meas = np.array([r.measured_s for r in log])
    pred = np.array([r.predicted_s for r in log])
    err = pred / meas - 1.0
    return {"steps": len(log), "busy_fraction": float(np.median([r.summary["busy_fraction"] for r in executed])),
            "median_abs_error": float(np.median(np.abs(err))),
            "median_error": float(np.median(err)), "total_error": float(pred.sum() / meas.sum() - 1.0),
            "measured_s": float(meas.sum()), "predicted_s": float(pred.sum()),
            "modes": {m: sum(r.mode == m for r in log) for m in sorted({r.mode for r in log})}}


def validate(device: str = "cpu", profile: str | Path = "", model: str | None = None,
             policies: Sequence[str] = tuple(POLICIES), requests: int = 60, rate: float = 4.0, seed: int = 0,
             repeats: int = 1, step_repeats: int = 3, threads: int | None = 1, tol_p50: float | None = None,
             tol_p99: float | None = TOL_P99, progress: Progress | None = None,
             graphs: bool | None = None) -> Validation:
    """Run the workload through the executor and the simulator for each policy; compare.

    Tolerances bound |simulated / measured - 1| for TTFT and TPOT (E2E is
    reported, not gated); ``tol_p50`` defaults to 0.15 on the CPU, 0.10 on a GPU.
    ``repeats`` executor runs per policy (metrics: their median); each executed
    step runs ``step_repeats`` times and costs its median run (a re-run is
    idempotent; first-run kernel compilation and bursts of contention stay out).
    ``graphs``: pure-decode steps on the executor's graph path (default: on CUDA;
    :class:`batchsim.calibrate.executor.ReferenceModel`); meta and each policy's
    step summary say how the steps ran.
    """
    from batchsim.calibrate import kernels as K
    from batchsim.calibrate.executor import ReferenceModel
    from batchsim.calibrate.graphs import summary
    from batchsim.app.runner import build_parts, simulate

    dev = K.resolve_device(device)
    if dev.type == "cpu":
        K.keep_heap()
    hw = load_hardware(str(profile))
    dtype = str(hw.provenance.get("calibration", {}).get("dtype", "bf16"))
    model = model or DEFAULT_MODELS[dev.type][0]
    tol_p50 = tol_p50 if tol_p50 is not None else (0.15 if dev.type == "cpu" else 0.10)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise InputError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}", "--policies")
    tick = progress or (lambda done, total, label: None)
    spec = load_model(model)
    meta = {"device": device, "device_name": K.device_name(dev), "profile": str(profile), "model": spec.name,
            "dtype": dtype, "requests": requests, "rate": rate, "seed": seed, "repeats": repeats,
            "step_repeats": step_repeats,
            "tolerances": {"p50": tol_p50, "p99": tol_p99}, "date": datetime.date.today().isoformat()}
    rows, steps, runs, logs = [], {}, {}, {}
    with _Threads(threads if dev.type == "cpu" else None):
        ref = None
        for i, name in enumerate(policies):
            sc = _scenario(model, str(profile), dtype, POLICIES[name], requests, rate, seed)
            parts = build_parts(sc)
            if ref is None:
                wl = parts.workload
                # NOTE: a static batch's dead slots decode at the longest prompt plus the longest output
                longest = int(wl.prompt_tokens.max() + wl.output_tokens.max())
                ref = ReferenceModel(spec, dev, dtype, max_len=longest + 8, slots=32, graphs=graphs)
                ref.warm_up(8 * int(wl.prompt_tokens.max()), 32, max_prompt=int(wl.prompt_tokens.max()),
                            graph_rows=_decode_rows(policies))
                warm = summary(ref, [])
                # NOTE: and one untimed pass over the workload: the first policy measured
                # ran 15-30% slow without it (shapes first met mid-run), later ones did not.
                _executor_runs(sc, parts, ref, 1, 1)
            tick(i, len(policies), f"{name}: executor")
            executed, log = _executor_runs(sc, parts, ref, repeats, step_repeats)
            simulated = simulate(sc, parts)
            runs[name] = {"executor": executed, "simulator": simulated}
            logs[name] = log
            rows += _compare(name, executed, simulated, tol_p50, tol_p99)
            steps[name] = _step_summary(log, executed)
        tick(len(policies), len(policies), "done")
    if ref is not None:  # (how the timed steps ran, and what the warm-up captured)
        meta["executor_steps"] = dict(summary(ref, [r.mode for log in logs.values() for r in log]),
                                      captured_at_warm_up=warm["captured"])
    return Validation(meta, rows, steps, runs, logs)


def _decode_rows(policies: Sequence[str]) -> int:
    """The largest decode batch the policies can run: the decode graphs a warm-up captures."""
    return max(max(POLICIES[p].get("max_num_seqs", 0), POLICIES[p].get("max_batch_size", 0)) for p in policies)


class _Recorded:
    """An executor run read back from its requests.csv: the summary fields :func:`_compare` reads."""

    def __init__(self, requests) -> None:
        import pandas as pd

        from batchsim.sim.metrics import _stats

        done = requests[requests["status"] == "completed"]
        self.summary: dict = {}
        for name in METRICS:
            self.summary.update(_stats(name, pd.to_numeric(done[name], errors="coerce").to_numpy(dtype=float)))


def replay(folder: str | Path, profile: str | Path, tol_p50: float | None = None,
           tol_p99: float | None = None) -> Validation:
    """Compare a new profile's simulation with the executor runs a ``validate`` already recorded.

    Reads ``folder``/validate.json (the workload) and each policy's
    executor_requests*.csv, simulates the same scenario priced by ``profile``
    and compares as :func:`validate` does. No device and no torch: a profile
    refitted from evidence (``batchsim calibrate --refit``) is checked against
    the real runs it was not fitted to. Step-time errors need the executed
    shapes and are not recomputed (``steps`` stays empty).
    """
    import json

    from batchsim.app.runner import build_parts, simulate

    folder = Path(folder)
    where = str(folder / "validate.json")
    try:
        data = json.loads((folder / "validate.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"not a validate output folder ({e})", where) from None
    meta = data.get("meta") if isinstance(data, dict) else None
    metrics = data.get("metrics") if isinstance(data, dict) else None
    need = ("model", "dtype", "requests", "rate", "seed", "repeats", "tolerances")
    if not isinstance(meta, dict) or not isinstance(metrics, list) or any(k not in meta for k in need):
        raise InputError(f"not a validate.json: needs meta ({', '.join(need)}) and metrics", where)
    if isinstance(meta["repeats"], bool) or not isinstance(meta["repeats"], int) or meta["repeats"] < 1:
        raise InputError(f"meta.repeats must be a whole number >= 1, got {meta['repeats']!r}", where)
    hw = load_hardware(str(profile))
    recorded = meta["tolerances"] if isinstance(meta["tolerances"], dict) else {}
    tol_p50 = tol_p50 if tol_p50 is not None else recorded.get("p50")
    tol_p99 = tol_p99 if tol_p99 is not None else recorded.get("p99")
    policies = [p for p in POLICIES if any(isinstance(r, dict) and r.get("policy") == p for r in metrics)]
    if not policies:
        raise InputError(f"no known policy in its metrics ({', '.join(POLICIES)})", where)
    rows, runs = [], {}
    for name in policies:
        # NOTE: the recorded runs only (executor_requests.csv, then _1.._{repeats-1}), not leftovers
        # of an earlier run into the same folder
        files = [folder / name / _requests_name(i) for i in range(int(meta["repeats"]))]
        executed = [_Recorded(_requests_csv(f)) for f in files]
        try:
            sc = _scenario(str(meta["model"]), str(profile), str(meta["dtype"]), POLICIES[name],
                           int(meta["requests"]), float(meta["rate"]), int(meta["seed"]))
        except (TypeError, ValueError) as e:
            raise InputError(f"bad workload in meta: {e}", where) from None
        simulated = simulate(sc, build_parts(sc))
        runs[name] = {"executor": [], "simulator": simulated}
        rows += _compare(name, executed, simulated, tol_p50, tol_p99)
    meta = dict(meta, profile=str(profile), profile_name=hw.name, replayed_from=str(folder),
                tolerances={"p50": tol_p50, "p99": tol_p99}, date=datetime.date.today().isoformat())
    return Validation(meta, rows, {}, runs)


def _requests_name(i: int) -> str:
    """The file of an executor run's requests: the first run's, then ``_1``, ``_2``..."""
    return f"executor_requests{'' if i == 0 else f'_{i}'}.csv"


def _requests_csv(path: Path):
    """An executor's recorded requests (status and the latency columns), or InputError."""
    if not path.is_file():
        raise InputError("missing: validate.json records this run", str(path))
    return _read_csv(path, ("status", *METRICS))


def _compare(policy: str, executed: list, simulated, tol_p50: float, tol_p99: float | None) -> list[dict]:
    """One row per metric and percentile: median over executor repeats against the simulation."""
    out = []
    for metric in METRICS:
        for pct, key in _KEYS.items():
            k = f"{key}_{metric}_ms"
            # a null latency (no request had it) is NaN here: it fails its tolerance
            meas = float(np.median([np.nan if r.summary[k] is None else r.summary[k] for r in executed]))
            sim = float("nan") if simulated.summary[k] is None else float(simulated.summary[k])
            err = sim / meas - 1.0 if meas > 0 else (0.0 if sim == 0 else math.inf)
            tol = None if metric == "e2el" else (tol_p50 if pct == "p50" else tol_p99)
            out.append({"policy": policy, "metric": metric, "percentile": pct, "measured_ms": meas,
                        "simulated_ms": sim, "rel_error": err, "tolerance": tol,
                        "ok": tol is None or abs(err) <= tol})
    return out


def write_validation(v: Validation, out: str | Path) -> dict[str, Path]:
    """validate.json, validate.csv, validate.png, and per policy both runs' requests.csv."""
    import pandas as pd

    from batchsim.sim.io import atomic_write_bytes, write_csv, write_json

    out = Path(out)
    files = {"validate.json": out / "validate.json", "validate.csv": out / "validate.csv",
             "validate.png": out / "validate.png"}
    rows = [dict(r, rel_error=r["rel_error"] if math.isfinite(r["rel_error"]) else None) for r in v.rows]
    write_json(files["validate.json"], {"meta": v.meta, "passed": v.passed, "metrics": rows, "steps": v.steps})
    write_csv(files["validate.csv"], pd.DataFrame(v.rows))
    for policy, run in v.runs.items():
        for i, r in enumerate(run["executor"]):
            write_csv(out / policy / _requests_name(i), r.requests)
        write_csv(out / policy / "simulator_requests.csv", run["simulator"].requests)
        if run["executor"]:
            steps = run["executor"][0].steps
            log = v.logs.get(policy) or []
            if len(log) >= len(steps):  # (how each step ran: the first run's records lead the log)
                steps = steps.assign(mode=[r.mode for r in log[:len(steps)]])
            write_csv(out / policy / "executor_steps.csv", steps)
        if v.logs.get(policy):
            write_csv(out / policy / "executor_step_times.csv", pd.DataFrame([r._asdict() for r in v.logs[policy]]))
    atomic_write_bytes(files["validate.png"], _plot(v))
    return files


def _plot(v: Validation) -> bytes:
    """Relative error per policy and metric against the tolerances, and step-time error per policy."""
    import io

    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[3, 1])
    policies = list(dict.fromkeys(r["policy"] for r in v.rows))
    labels = [f"{m.upper()} {p}" for m in METRICS for p in _KEYS]
    width = 0.8 / max(len(policies), 1)
    for j, policy in enumerate(policies):
        errs = [next(r["rel_error"] for r in v.rows if r["policy"] == policy and r["metric"] == m
                     and r["percentile"] == p) * 100 for m in METRICS for p in _KEYS]
        ax.bar(np.arange(len(labels)) + (j - (len(policies) - 1) / 2) * width, errs, width, label=policy)
    for tol, style in ((v.meta["tolerances"]["p50"], "--"), (v.meta["tolerances"]["p99"], ":")):
        if tol is not None:
            for sign in (1, -1):
                ax.axhline(sign * tol * 100, color="grey", linestyle=style, linewidth=1)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(labels)), labels, rotation=30)
    ax.set_ylabel("simulated / measured - 1 (%)")
    ax.set_title(f"{v.meta['model']} on {v.meta['device_name']}: simulator vs reference executor")
    ax.legend(fontsize=8)
    ax2.bar(policies, [v.steps[p]["median_abs_error"] * 100 if p in v.steps else 0.0 for p in policies],
            color="tab:gray")
    ax2.set_ylabel("median |step-time error| (%)")
    ax2.tick_params(axis="x", rotation=30)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()
