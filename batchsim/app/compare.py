"""``batchsim compare``: every chosen policy on the identical workload and cost model.

The scenario's policy section is swapped for each policy (the KV knobs
``block_size``, ``gpu_memory_utilization`` and ``max_model_len`` are kept so
every policy has the same KV cache); seed i of ``--seeds N`` uses
``scenario.seed + i``. Runs are independent tasks for
:func:`batchsim.app.workers.run_tasks`; each task is a picklable :class:`RunTask`
(a scenario dict and the folder its relative paths resolve against) and
rebuilds its parts in the worker. The workload is a pure function of the
scenario's workload section and seed, so every policy sees identical
requests wherever it runs. The report itself is made by ``batchsim/reports/`` from
the records this module collects.

Resumable: with an output folder, every finished task is stored as it finishes
under ``OUT/points/<key>.json`` (its summary and run facts; seed 0 also keeps the
record columns the report reads, :data:`REPORT_RECORDS`, in ``<key>.npz``); a
rerun into the same folder reads them back and simulates only the missing tasks.
A fresh result is handed on exactly as it reads back from its point (the JSON
round trip, the stored columns), so a resumed run's outputs are byte-identical
to an uninterrupted one's. The key (:func:`point_key`) hashes the task's whole
scenario, so a changed scenario simply gets new points.
"""

from __future__ import annotations

import io
import json
import time
from collections import OrderedDict
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from batchsim.reports.progress import progress
from batchsim.reports.runs import PolicyRun, ReportInfo
from batchsim.app.config import Scenario, scenario_from_dict
from batchsim.sim.errors import InputError
from batchsim.sim.measure import DEFAULT_SEEDS
from batchsim.sim.io import atomic_write_bytes, atomic_write_text
from batchsim.app.workers import interrupted, run_tasks

__all__ = ["policy_variants", "DEFAULT_POLICIES", "DEFAULT_SEEDS", "KEEP_KNOBS", "Comparison", "RunTask", "RunOutput", "compare",
           "parse_policies", "with_policy", "with_seed", "scenario_data", "run_task",
           "simulate_task", "report_info", "write_comparison", "call_text", "policy_config",
           "describe_workload", "knob_text", "POINT_FORMAT", "REPORT_RECORDS", "point_key", "points_folder",
           "read_point", "write_point", "plain", "clean_point_temps", "run_resumable"]

DEFAULT_POLICIES = ("static", "dynamic", "continuous", "chunked_prefill")

# Knobs that are not a policy's rules: the replica's KV cache (and prefix caching, for the policies
# that have it) is the same whichever policy a compare, sweep, plan or `run --policy` swaps in.
KEEP_KNOBS = ("block_size", "gpu_memory_utilization", "gpu_memory_utilization_of", "max_model_len",
              "enable_prefix_caching")


def policy_variants(scenario: Scenario, policies: str | Sequence[str] | None) -> list[tuple[str, Scenario]]:
    """``(label, scenario)`` per policy compare and sweep run: :func:`with_policy` of each. A
    disaggregated scenario with the default policies runs its own deployment alone, labelled xPyD
    (its pools name their policies; another policy is an error: :func:`with_policy`)."""
    names = parse_policies(policies)
    d = scenario.disaggregation
    if d is not None and names == DEFAULT_POLICIES:
        return [(f"{d.prefill.replicas}P{d.decode.replicas}D", scenario)]
    return [(p, with_policy(scenario, p)) for p in names]


def parse_policies(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"a,b"`` (or a list) -> unique names in order; empty means all four built-ins."""
    items = text.split(",") if isinstance(text, str) else list(text or [])
    names = tuple(dict.fromkeys(s.strip() for s in items if s.strip()))
    return names or DEFAULT_POLICIES


def scenario_data(scenario: Scenario) -> dict:
    """The scenario as the plain dict it was written as (unset defaults left out).

    NOTE: ``exclude_unset`` matters: a trace workload forbids an explicit
    ``arrival`` section, which dumping the defaults would add.
    """
    return scenario.model_dump(mode="json", exclude_unset=True)


def with_policy(scenario: Scenario, name: str) -> Scenario:
    """The scenario with ``name`` as its policy: the same KV knobs, plus the
    knobs ``policy_knobs[name]`` gives (defaults otherwise).

    The scenario's own policy keeps all its knobs (comparing it is not a swap); ``policy_knobs[name]``
    sets those its policy section does not set itself (over what an engine preset filled). Either
    way ``name`` is then the user's choice, not the preset's: a preset resolved again (another
    device, context or preset) keeps it.
    """
    if scenario.policy.get("name") == name:
        return _own_policy(scenario, name)
    if scenario.disaggregation is not None:
        raise InputError(f"cannot run policy {name!r} on a disaggregated scenario: its pools take their policies "
                         "from disaggregation.prefill.policy and .decode.policy (or the scenario's own); compare "
                         "deployments and policies with batchsim plan --disagg colocated,1P1D,...", "--policies")
    from batchsim.policies.registry import policy_class

    fields = policy_class(name).Config.model_fields
    data = scenario_data(scenario)
    keep = {k: v for k, v in scenario.policy.items() if k in KEEP_KNOBS and k in fields}
    data["policy"] = {**keep, **scenario.policy_knobs.get(name, {}), "name": name}
    if scenario.engine_preset_values:  # (kept knobs the preset filled stay its: it resolves them for `name`)
        mine = scenario.policy_knobs.get(name, {})
        data["engine_preset_values"] = {k: v for k, v in scenario.engine_preset_values.items()
                                        if k in keep and k not in mine}
    return scenario_from_dict(data, f"--policies {name}")


def load_with_policy(path, policy: str | None, sets: Sequence[str]) -> Scenario:
    """The scenario ``batchsim run PATH [--policy P] --set ...`` runs: the file with the overrides and,
    with ``P``, the swap compare, sweep and plan make (:func:`with_policy`), after which the ``--set
    policy.*`` overrides apply to ``P``, the policy that runs (before the swap they would set the
    file's policy and be lost with it)."""
    from batchsim.app.config import apply_overrides, load_scenario

    sets = list(sets)
    if not policy:
        return load_scenario(path, sets)
    own = [s for s in sets if s.split("=", 1)[0].strip().split(".")[0] == "policy"]
    sc = with_policy(load_scenario(path, [s for s in sets if s not in own]), policy)
    if not own:
        return sc
    return scenario_from_dict(apply_overrides(scenario_data(sc), own), str(path))


def _own_policy(scenario: Scenario, name: str) -> Scenario:
    """:func:`with_policy` for the scenario's own policy: its keys win, ``policy_knobs[name]`` sets the
    others (a section such as ``cuda_graphs`` key by key), and the preset's record no longer holds
    ``name`` or those knobs (they are the user's)."""
    knobs = scenario.policy_knobs.get(name, {})
    filled = scenario.engine_preset_values
    if "name" not in filled and not knobs:
        return scenario
    from batchsim.engines import user_policy

    mine = user_policy(scenario)
    policy = dict(scenario.policy)
    record = {k: v for k, v in filled.items() if k != "name"}
    for key, value in knobs.items():
        section = isinstance(value, dict) and isinstance(policy.get(key), dict)
        if key in mine and not (section and isinstance(mine[key], dict)):
            continue  # (the scenario's own key)
        if section:
            own = mine.get(key, {})
            given = {k: v for k, v in value.items() if k not in own}
            policy[key] = {**policy[key], **given}
            if isinstance(record.get(key), dict):
                record[key] = {k: v for k, v in record[key].items() if k not in given}
        else:
            policy[key] = value
            record.pop(key, None)
    data = scenario_data(scenario)
    data["policy"] = {**policy, "name": name}
    if filled:
        data["engine_preset_values"] = record
    return scenario_from_dict(data, f"--policies {name}")


def with_seed(scenario: Scenario, index: int) -> Scenario:
    """Seed ``index`` of a multi-seed run: ``scenario.seed + index``."""
    if index == 0:
        return scenario
    data = scenario_data(scenario)
    data["seed"] = scenario.seed + index
    return scenario_from_dict(data, "seed")


@dataclass(frozen=True)
class RunTask:
    """One simulation to run anywhere: plain data, so it pickles."""

    scenario: dict
    base_dir: str | None
    label: str
    seed_index: int = 0
    keep_records: bool = True


@dataclass
class RunOutput:
    """What a worker sends back: the summary, run facts and (optionally) records."""

    label: str
    seed_index: int
    summary: dict
    meta: dict
    requests: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    itl: pd.DataFrame | None = None  # the ITL population as (gap, count): batchsim.reports.derive.report_itl


# NOTE: a tiny per-process memo of built parts, keyed by the scenario minus its
# policy: in-process (serial) runs build the model, cost model and workload
# once for all policies; pool workers build them once per worker. Two entries
# bound the memory a long sweep can pin.
_PARTS: "OrderedDict[str, Any]" = OrderedDict()
_PARTS_MAX = 2


def _parts_for(scenario: Scenario, data: dict, base_dir: str | None):
    from batchsim.app.runner import build_parts

    key = json.dumps({k: v for k, v in data.items() if k != "policy"}, sort_keys=True) + f"|{base_dir}"
    if key not in _PARTS:
        _PARTS[key] = build_parts(scenario, Path(base_dir) if base_dir else None)
        while len(_PARTS) > _PARTS_MAX:
            _PARTS.popitem(last=False)
    return _PARTS[key]


def simulate_task(task: RunTask):
    """Validate, build (or reuse) the parts, simulate: ``(RunResult, run meta)``."""
    from batchsim.app.runner import simulate

    scenario = scenario_from_dict(task.scenario, task.label)
    parts = _parts_for(scenario, task.scenario, task.base_dir)
    result = simulate(scenario, parts)
    meta = dict(result.meta, peak_flops=float(parts.cost.peak_flops),
                peak_bandwidth=float(parts.cost.peak_bandwidth), replicas=scenario.replicas,
                warmup_s=scenario.measure.warmup_s, cooldown_s=scenario.measure.cooldown_s,
                warmup_requests=scenario.measure.warmup_requests, cooldown_requests=scenario.measure.cooldown_requests)
    return result, meta


def run_task(task: RunTask) -> RunOutput:
    """The compare worker (module level, so process pools and Ray can pickle it)."""
    result, meta = simulate_task(task)
    out = RunOutput(task.label, task.seed_index, result.summary, meta)
    if task.keep_records:
        from batchsim.reports.derive import report_itl

        out.requests, out.steps, out.itl = result.requests, result.steps, report_itl(result.requests, result.itl, meta)
    return out


# -- finished tasks stored as points (resume) ----------------------------------------------------
POINT_FORMAT = 2  # bump when a stored compare/sweep point's meaning changes (invalidates stored points)

# The record columns compare's report reads (batchsim.reports.derive via plots: latency samples,
# timelines, token split). A compare with an output folder stores only these and hands the
# report only these, fresh or read back, so a report that starts reading another column fails
# loudly (KeyError) in every compare test instead of differing after a resume.
REPORT_RECORDS: dict[str, tuple[str, ...]] = {
    "requests": ("rid", "status", "arrival", "admitted", "ttft", "tpot", "e2el"),
    "steps": ("replica", "start", "end", "num_seqs", "kv_used_blocks", "prefill_tokens", "decode_tokens",
              "padding_tokens", "useful_flops", "bytes", "compute_s", "memory_s"),
    "itl": ("gap", "count"),
}
_TEMP_AGE_S = 3600.0  # a point's temporary file older than this is a killed writer's


def point_key(kind: str, scenario: dict, base_dir: str | None, **extra: Any) -> str:
    """The hash that names a stored point (:func:`batchsim.app.points.point_key`: the scenario,
    the files it reads, the code) with what made it (``kind``: compare, sweep), the format and
    ``extra`` (the task's label, ...)."""
    from batchsim.app.points import point_key as key

    return key(scenario, base_dir, kind=kind, format=POINT_FORMAT, **extra)


def points_folder(out_dir: str | Path | None) -> Path | None:
    """Where a run into ``out_dir`` stores its points: ``out_dir/points``."""
    return None if out_dir is None else Path(out_dir) / "points"


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def _dumps(obj: Any) -> str:
    # NOTE: allow_nan: a point's metrics may be NaN (Python's json reads NaN back exactly)
    return json.dumps(obj, indent=1, allow_nan=True, default=_json_default) + "\n"


def plain(obj: Any) -> Any:
    """``obj`` as it reads back from a stored point (the JSON round trip: numpy scalars become
    Python numbers, tuples lists). Fresh results pass through this too, so a resumed run
    and an uninterrupted one hand identical values on."""
    return json.loads(_dumps(obj))


def _encode(frames: dict[str, pd.DataFrame]) -> tuple[dict[str, np.ndarray], dict[str, dict[str, str]]]:
    """The :data:`REPORT_RECORDS` columns of each frame as plain numpy arrays (``name/column``;
    text as fixed-width unicode plus a ``.na`` mask where values are missing) and their dtypes."""
    arrays, dtypes = {}, {}
    for name, frame in frames.items():
        dtypes[name] = {}
        for col in REPORT_RECORDS[name]:
            series = frame[col]
            dtypes[name][col] = str(series.dtype)
            if series.dtype.kind in "biuf":
                arrays[f"{name}/{col}"] = series.to_numpy(copy=True)
                continue
            na = series.isna().to_numpy(dtype=bool)
            arrays[f"{name}/{col}"] = np.array(["" if m else str(v) for v, m in zip(series.to_numpy(dtype=object), na)],
                                               dtype=str)
            if na.any():
                arrays[f"{name}/{col}.na"] = na
    return arrays, dtypes


def _decode(arrays: dict[str, np.ndarray], dtypes: dict[str, dict[str, str]]) -> dict[str, pd.DataFrame]:
    frames = {}
    for name, cols in dtypes.items():
        data = {}
        for col, dtype in cols.items():
            a = arrays[f"{name}/{col}"]
            if a.dtype.kind in "biuf":
                data[col] = pd.Series(a, dtype=dtype)
                continue
            values = a.astype(object)
            na = arrays.get(f"{name}/{col}.na")
            if na is not None:
                values[na] = None
            data[col] = pd.Series(values, dtype=dtype)
        frames[name] = pd.DataFrame(data, index=pd.RangeIndex(len(next(iter(data.values()), ()))))
    return frames


def write_point(folder: Path, key: str, record: dict, frames: dict[str, pd.DataFrame] | None = None) -> tuple[dict, dict]:
    """Store a finished task as ``folder/<key>.json`` (and its record columns as
    ``<key>.npz``, written first: the JSON is the point's last file, so a point
    without it is missing). Returns ``(record, frames)`` as they read back."""
    arrays, dtypes = _encode(frames) if frames else ({}, None)
    record = plain({"format": POINT_FORMAT, "key": key, **record, "records": dtypes})
    if arrays:
        buf = io.BytesIO()
        np.savez_compressed(buf, allow_pickle=False, **arrays)
        atomic_write_bytes(folder / f"{key}.npz", buf.getvalue())
    atomic_write_text(folder / f"{key}.json", _dumps(record))
    return record, (_decode(arrays, dtypes) if dtypes else {})


def read_point(folder: Path, key: str, kind: str, records: bool = False) -> tuple[dict, dict] | None:
    """A stored point, ``(record, frames)``, or None when it is missing, damaged, from
    another format, or lacks the records asked for (then it is simulated again)."""
    try:
        record = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
        if record.get("format") != POINT_FORMAT or record.get("key") != key or record.get("kind") != kind:
            return None
        dtypes = record.get("records")
        if not records or not dtypes:
            return (record, {}) if not records else None
        if any(tuple(dtypes.get(name, {})) != cols for name, cols in REPORT_RECORDS.items()):
            return None  # stored before the report read other columns: simulate again
        with np.load(folder / f"{key}.npz") as z:  # (numpy's default: no pickled objects are loaded)
            arrays = {k: z[k] for k in z.files}
        return record, _decode(arrays, dtypes)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # missing, or damaged by something other than our atomic writes: simulate again


def clean_point_temps(folder: Path | None, age_s: float = _TEMP_AGE_S) -> None:
    """Remove the temporary files a killed writer left in ``folder`` (``.<key>.json.*.tmp``,
    ``.<key>.npz.*.tmp``, as batchsim.sim.io's atomic writes name them) older than ``age_s``;
    a younger one may be another run's write in progress."""
    if folder is None or not folder.is_dir():
        return
    now = time.time()
    for p in folder.glob(".*.tmp"):
        try:
            if p.is_file() and now - p.stat().st_mtime > age_s:
                p.unlink()
        except OSError:
            pass


def _stored_output(folder: Path, key: str, task: RunTask, out: RunOutput) -> RunOutput:
    """Store a fresh compare result; return it as it reads back."""
    frames = ({"requests": out.requests, "steps": out.steps, "itl": out.itl}
              if task.keep_records and out.requests is not None else None)
    record, frames = write_point(folder, key, {"kind": "compare", "label": out.label, "seed_index": out.seed_index,
                                               "scenario": task.scenario, "summary": out.summary,
                                               "meta": out.meta}, frames)
    return _output_from(record, frames)


def _output_from(record: dict, frames: dict) -> RunOutput:
    return RunOutput(record["label"], record["seed_index"], record["summary"], record["meta"],
                     frames.get("requests"), frames.get("steps"), frames.get("itl"))


def run_resumable(task_fn: Callable[[Any], Any], tasks: Sequence[Any], store: Path | None,
                  read: Callable[[int], Any], keep: Callable[[int, Any], Any], label: str,
                  describe: Callable[[Any], str], executor: str, workers: int | None,
                  show_progress: bool | None) -> tuple[list[Any], int]:
    """The resume loop of compare and sweep: ``(results in task order, how many were simulated)``.

    With a ``store``, task ``i``'s stored result is ``read(i)`` (None: missing); the others run
    through :func:`batchsim.app.workers.run_tasks`, and each fresh result becomes ``keep(i,
    result)`` (stored now, so a killed run keeps it, and handed on as it reads back). Ctrl-C
    raises :class:`batchsim.app.workers.Interrupted` saying how many are kept."""
    results: list[Any] = [None] * len(tasks)
    todo: list[int] = []
    try:
        if store is not None:
            store.mkdir(parents=True, exist_ok=True)  # (an --out that is a file fails here, before any run)
            clean_point_temps(store)
            results = [read(i) for i in range(len(tasks))]
        todo = [i for i, r in enumerate(results) if r is None]
        if todo:
            with progress(len(todo), label, show_progress) as advance, \
                    closing(run_tasks(task_fn, [tasks[i] for i in todo], executor, workers)) as finished:
                for j, out in finished:
                    i = todo[j]
                    results[i] = keep(i, out)
                    advance(describe(results[i]))
    except KeyboardInterrupt:
        raise interrupted(sum(r is not None for r in results) if store is not None else 0, store) from None
    return results, len(todo)


@dataclass
class Comparison:
    """A finished comparison: per-policy runs (records + summaries) and the header."""

    scenario: Scenario
    runs: list[PolicyRun]
    info: ReportInfo
    policy_knobs: list[str]  # one "name(knob=value, ...)" line per policy
    simulated: int = 0  # tasks simulated by this call
    reused: int = 0  # tasks read back from points_dir
    points_dir: Path | None = None  # where finished tasks are stored (None: nowhere)

    @property
    def summaries(self) -> list[dict]:
        """Each policy's summary (means over seeds when there are several)."""
        return [r.stats() for r in self.runs]


def policy_config(scenario: Scenario) -> dict:
    """Build the policy once here so a bad name or knob fails before any run;
    return its full config (every knob, defaults included) for the report."""
    from batchsim.policies import create_policy

    config = getattr(create_policy(scenario.policy), "config", None)
    return config.model_dump(mode="json") if hasattr(config, "model_dump") else dict(scenario.policy)


def compare(scenario: Scenario, policies: Sequence[str] = DEFAULT_POLICIES, seeds: int = DEFAULT_SEEDS,
            base_dir: str | Path | None = None, executor: str = "local", workers: int | None = None,
            show_progress: bool | None = None,
            task_fn: Callable[[RunTask], RunOutput] = run_task,
            out_dir: str | Path | None = None) -> Comparison:
    """Run every policy (x seeds) on the scenario's workload; collect records and summaries.

    With ``out_dir``, finished tasks are stored in ``out_dir/points`` as they finish and the
    ones already there are read back instead of simulated (see the module notes). Ctrl-C
    raises :class:`batchsim.app.workers.Interrupted` saying how many are kept.
    ``task_fn`` is the worker (module level); tests pass a double.
    """
    if seeds < 1:
        raise InputError(f"must be at least 1, got {seeds}", "--seeds")
    pairs = policy_variants(scenario, policies)
    names, variants = [p for p, _ in pairs], [v for _, v in pairs]
    knobs = [policy_config(v) if task_fn is run_task else dict(v.policy) for v in variants]
    base = str(base_dir) if base_dir is not None else None
    tasks = [RunTask(scenario_data(with_seed(v, i)), base, p, i, keep_records=(i == 0))
             for p, v in zip(names, variants) for i in range(seeds)]
    store = points_folder(out_dir)
    keys = [point_key("compare", t.scenario, t.base_dir, label=t.label, seed_index=t.seed_index) for t in tasks]

    def read(i: int) -> RunOutput | None:
        found = read_point(store, keys[i], "compare", records=tasks[i].keep_records)
        return _output_from(*found) if found is not None else None

    def keep(i: int, out: RunOutput) -> RunOutput:
        return _stored_output(store, keys[i], tasks[i], out) if store is not None else out

    results, simulated = run_resumable(task_fn, tasks, store, read, keep, f"compare {scenario.name}",
                                       lambda out: f"{out.label} (seed {scenario.seed + out.seed_index})",
                                       executor, workers, show_progress)
    runs = []
    for k, p in enumerate(names):
        group = results[k * seeds:(k + 1) * seeds]
        first = group[0]
        runs.append(PolicyRun(policy=p, requests=first.requests, steps=first.steps, itl=first.itl,
                              summaries=tuple(r.summary for r in group), meta=first.meta))
    metas = [r.meta for r in runs]
    return Comparison(scenario, runs, report_info(scenario, metas, seeds, "compare"),
                      [knob_text(k, m) for k, m in zip(knobs, metas)], simulated=simulated,
                      reused=len(tasks) - simulated, points_dir=store)


def knob_text(config: dict, meta: dict) -> str:
    """One report line per policy: every knob, and the KV cache it got."""
    kv = meta.get("kv_capacity_tokens")
    return call_text(config, "name") + (f"; KV cache {int(kv):,} tokens per replica" if kv is not None else "")


def call_text(spec: Any, kind: str) -> str:
    """A config as ``name(knob=value, ...)``; ``kind`` is its name field (name, process, dist)."""
    d = spec.model_dump(mode="json", exclude_none=True) if hasattr(spec, "model_dump") else dict(spec)
    name = d.pop(kind, d.pop("name", "?"))
    return f"{name}(" + ", ".join(f"{k}={v}" for k, v in d.items()) + ")"


def describe_workload(scenario: Scenario) -> str:
    """One line: how many requests, arriving how, with what lengths."""
    w = scenario.workload
    size = ", ".join(x for x in (f"{w.num_requests} requests" if w.num_requests is not None else "",
                                 f"{w.duration_s:g} s" if w.duration_s is not None else "") if x)
    if w.trace is not None:
        src = f"trace {w.trace.format}: {w.trace.path}"
        arrival = "" if w.trace_has_arrivals else f"; arrivals {call_text(w.arrival, 'process')}"
        return f"{src}{arrival}" + (f" ({size})" if size else "")
    return (f"{size}; arrivals {call_text(w.arrival, 'process')}; prompt {call_text(w.prompt_tokens, 'dist')}; "
            f"output {call_text(w.output_tokens, 'dist')}")


def _kv_text(metas: Sequence[dict]) -> str:
    """KV capacity per replica: one number, or the range over policies (each
    policy's own limits size the activation reserve, so capacities differ)."""
    tokens = sorted({int(m["kv_capacity_tokens"]) for m in metas if "kv_capacity_tokens" in m})
    block = metas[0].get("block_size", "?") if metas else "?"
    if not tokens:
        return "?"
    span = f"{tokens[0]:,}" if len(tokens) == 1 else f"{tokens[0]:,}–{tokens[-1]:,} (by policy)"
    return f"{span} tokens per replica (block size {block})"


def report_info(scenario: Scenario, metas: Sequence[dict], seeds: int, kind: str) -> ReportInfo:
    """The report header from the scenario and each policy's run meta."""
    from batchsim import __version__

    meta = metas[0] if metas else {}

    slo = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in scenario.slo.limits().items())
    seed_text = str(scenario.seed) if seeds == 1 else f"{scenario.seed}…{scenario.seed + seeds - 1}"
    details = [
        ("cluster", f"TP={scenario.tensor_parallel_size}, {scenario.dtype}, {scenario.replicas} "
                    f"replica(s), router {scenario.router}"),
        ("KV capacity", _kv_text(metas)),
        ("workload", describe_workload(scenario)),
        ("SLO", slo or "none (goodput = throughput)"),
        ("seed values", seed_text),
    ]
    return ReportInfo(title=f"batchsim {kind}: {scenario.name}", scenario=scenario.name,
                      model=str(meta.get("model", scenario.model)),
                      hardware=str(meta.get("hardware", scenario.hardware)),
                      calibrated=bool(meta.get("calibrated", False)),
                      version=str(meta.get("batchsim_version", __version__)), seeds=seeds,
                      details=tuple(details))


def write_comparison(comp: Comparison, out_dir: str | Path) -> dict[str, Path]:
    """Write summary.csv, the PNGs and report.html for a comparison."""
    from batchsim.reports.report import write_compare_report

    return write_compare_report(out_dir, comp.runs, comp.info, comp.policy_knobs)
