"""The CI regression gate behind ``batchsim regress``: baselines and re-runs.

A *baseline* is a human-readable JSON file with one entry per pinned
scenario, keyed by the scenario file's path relative to the baseline file
(so the gate works from any working directory). An entry records the
scenario's input hash, the batchsim version that recorded it, the seeds it
ran, the engine that ran them and every numeric summary value, one per seed
(validated on load: anything malformed is an InputError naming the file, the
scenario key, the field and the value). :func:`regress` re-simulates each
scenario with ``seeds`` seeds (``scenario.seed + 0 .. seeds - 1``,
:func:`batchsim.app.compare.with_seed`; runs are deterministic, so unchanged code
reproduces the baseline exactly), pairs them with the baseline's seeds where
both hold them, and decides every metric of every scenario as one family
(:func:`batchsim.reports.regression.measure` then ``decide``: one-sided paired
t-tests against the tolerance, Holm over the whole run), so that a neutral
change fails at most 5% of runs and a real regression is not hidden by the
seed-to-seed noise.

Old one-seed baselines (format ``batchsim-regress-baseline/1``, one value
per metric) are still read: each value is the scenario's own seed, compared
exactly with that seed of the run, and the gate adds a note asking for ``--update``.

Mismatches are explained, never compared silently:

- the scenario's inputs changed (hash differs): a failure, listing which
  input changed, old and new hash; the metrics are still diffed for
  information. ``--update`` accepts the new inputs.
- the baseline was recorded by another batchsim version: a note; the values
  are compared anyway.
- a seed ran on another engine than the baseline's, or with an ``engine_reason``
  (the compiled core could not run the loaded rules): a note; the summaries'
  warnings are notes too.
- other seeds than the baseline's: paired on the seeds both hold, with a note.
- no entry for a scenario: a failure until ``--update`` records it.
- a run or a baseline entry with fewer than ``min_requests`` completed
  requests in its measured window (default
  :data:`batchsim.sim.metrics.MIN_REQUESTS`), or a gated metric that is null:
  *not evaluable*, a failure (a p99 over a handful of requests is about their
  maximum, and a null metric is not "unchanged").
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from batchsim.reports.regression import (DEFAULT_METRICS, RegressionReport, ScenarioDiff, _number, decide,
                                        measure)
from batchsim.reports.stats import _seed_warnings
from batchsim import __version__
from batchsim.app.config import Scenario, load_scenario, naming_file, short_repr
from batchsim.sim.errors import InputError
from batchsim.sim.io import atomic_write_text
from batchsim.sim.measure import MIN_REQUESTS, thin_window

__all__ = ["BASELINE_FORMAT", "DEFAULT_SEEDS", "Runner", "scenario_key", "scenario_inputs", "combine_hash",
           "load_baseline", "baseline_text", "parse_metrics", "reproduce_command", "regress"]

BASELINE_FORMAT = "batchsim-regress-baseline/2"
_OLD_FORMATS = ("batchsim-regress-baseline/1",)  # one value per metric: one seed

DEFAULT_SEEDS = 10
"""Seeds per scenario. Every check of a run is one Holm family (65 on the shipped
baselines), so each p-value must be small: at 5 seeds (4 degrees of freedom) a
rule edit whose effect varies from seed to seed, as latencies at the knee do, went
unseen on a single scenario (tests/test_rules_once.py's admission edit on
continuous.yaml); at 10 it is caught, false alarms stay at 0 of 20 neutral offsets,
and the shipped baselines simulate in about 3 s. See docs/regression-gate.md."""

Runner = Callable[[Scenario, Path], dict]
"""Runs one scenario (one seed) and returns its summary dict (injectable for tests)."""

_NOTE = ("Recorded by `batchsim regress --update`. Keys are scenario paths relative to this file; "
         "each metric lists one value per seed in `seeds`; re-record instead of editing by hand.")


def _default_runner(scenario: Scenario, base_dir: Path) -> dict:
    from batchsim.app.runner import run_scenario

    return run_scenario(scenario, base_dir, keep_steps=False).summary


# -------------------------------------------------------------------- hashing


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def scenario_key(path: Path, baseline: Path) -> str:
    """The baseline key of a scenario file: its path relative to the baseline's folder."""
    try:
        rel = os.path.relpath(path.resolve(), baseline.resolve().parent)
    except ValueError:  # another drive on Windows
        rel = str(path.resolve())
    return Path(rel).as_posix()


def _policy_dump(spec: dict) -> dict:
    """The policy section normalized by the policy's own Config (defaults dropped).

    Built by ``create_policy``, the one validation ``batchsim run`` uses too: a bad knob is
    the same InputError naming ``policy.<knob>`` and its value."""
    from batchsim.policies.registry import create_policy

    return create_policy(spec).config.model_dump(mode="json", exclude_defaults=True)


def _referenced(dump: dict, base_dir: Path) -> list[tuple[str, Path]]:
    """Files the scenario reads: ``model``/``hardware`` given as paths and every workload ``*.path``."""
    found: list[tuple[str, Path]] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                here = f"{where}.{k}" if where else str(k)
                if k == "path" and isinstance(v, str):
                    found.append((here, base_dir / Path(v).expanduser()))
                else:
                    walk(v, here)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")

    walk(dump.get("workload", {}), "workload")
    for field in ("model", "hardware"):
        # NOTE: mirrors calibrate's lookup: a path here is relative to the working
        # directory (not the scenario), and a model folder means its config.json.
        v = dump.get(field)
        p = Path(v).expanduser() if isinstance(v, str) else None
        if p is not None and p.is_dir():
            p = p / "config.json"
        if p is not None and p.is_file():
            found.append((field, p))
    return found


def scenario_inputs(scenario: Scenario, base_dir: Path) -> dict[str, str]:
    """Hashes of everything that decides a run's inputs, by label.

    ``scenario`` hashes the validated scenario as canonical JSON; each file it
    references adds ``file:<field>`` with a hash of the file's bytes.
    NOTE: the dump leaves out fields at their default value (and the policy
    section is normalized by the policy's Config the same way), so a file
    that spells a default out hashes like one that omits it, and a batchsim
    release that adds a field does not invalidate every baseline. The price:
    a release that *changes* a default keeps the hash, and shows up as moved
    metrics instead — which the gate reports anyway.
    NOTE: policy *code* is deliberately not hashed: a changed scheduler with
    the same scenario is exactly what the gate must compare.
    """
    dump = scenario.model_dump(mode="json", exclude_defaults=True)
    dump.pop("engine_preset_values", None)  # (batchsim's record of what a preset filled: the policy says it)
    dump["policy"] = _policy_dump(scenario.policy)
    inputs = {"scenario": _sha(_canonical(dump))}
    for label, path in _referenced(scenario.model_dump(mode="json"), base_dir):
        inputs[f"file:{label}"] = _sha(path.read_bytes()) if path.is_file() else "missing"
    return inputs


def combine_hash(inputs: dict[str, str]) -> str:
    """One hash over all input hashes (what the baseline compares first)."""
    return _sha(_canonical(inputs))


# ------------------------------------------------------------------- baseline


def load_baseline(path: Path) -> dict[str, dict]:
    """Read a baseline file's entries, each validated; every problem is an InputError naming the
    file, the scenario key, the field and the bad value (exit 2)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("baseline file not found; record one with --update "
                         "(batchsim regress SCENARIO... --baseline FILE --update)", str(path)) from None
    except IsADirectoryError:
        raise InputError("is a folder; expected a baseline JSON file", f"--baseline {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise InputError(f"not a JSON baseline ({e})", str(path)) from None
    if not isinstance(data, dict) or data.get("format") not in (BASELINE_FORMAT, *_OLD_FORMATS):
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise InputError(f"unknown baseline format {short_repr(got)}; expected {BASELINE_FORMAT!r}", str(path))
    entries = data.get("scenarios")
    if not isinstance(entries, dict) or not all(isinstance(e, dict) and isinstance(e.get("metrics"), dict)
                                                for e in entries.values()):
        raise InputError("'scenarios' must map scenario keys to entries with 'metrics'", str(path))
    for key, entry in entries.items():
        _check_entry(entry, data["format"] == BASELINE_FORMAT, f"{path}: scenarios[{json.dumps(key)}]")
    return entries


def _check_entry(entry: dict, per_seed: bool, where: str) -> None:
    """One baseline entry as ``--update`` writes it (``per_seed``: format /2, a list per metric)."""

    def bad(field: str, value: Any, expected: str) -> InputError:
        return InputError(f"got {short_repr(value)}; expected {expected}", f"{where}.{field}")

    for field in ("name", "policy", "batchsim_version", "scenario_hash"):
        if not isinstance(entry.get(field), str):
            raise bad(field, entry.get(field, "nothing"), "a string (re-record with --update)")
    inputs = entry.get("inputs")
    if not isinstance(inputs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in inputs.items()):
        raise bad("inputs", inputs, "a mapping of input labels to hashes")
    n = None
    if per_seed:
        seeds = entry.get("seeds")
        if (not isinstance(seeds, list) or not seeds or len(set(map(repr, seeds))) != len(seeds)
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
            raise bad("seeds", seeds, "a list of distinct whole numbers (the seeds the entry was recorded with)")
        n = len(seeds)
    for key, values in entry["metrics"].items():
        if per_seed:
            ok = isinstance(values, list) and len(values) == n and all(_value_ok(v) for v in values)
            expected = f"a list of {n} numbers or nulls, one per seed in 'seeds'"
        else:
            ok, expected = _value_ok(values), "a number or null (old one-seed format)"
        if not ok:
            raise bad(f"metrics.{key}", values, expected)
    engine = entry.get("engine")
    if engine is not None and not (isinstance(engine, str) or (
            n is not None and isinstance(engine, list) and len(engine) == n and all(isinstance(e, str) for e in engine))):
        raise bad("engine", engine, "the engine name, or one per seed in 'seeds'")


def _value_ok(v: Any) -> bool:
    return v is None or _number(v) is not None


def baseline_text(entries: dict[str, dict]) -> str:
    """The baseline file's text: scenarios sorted by key, one line per metric."""
    doc = {"format": BASELINE_FORMAT, "note": _NOTE,
           "scenarios": {k: entries[k] for k in sorted(entries)}}
    text = json.dumps(doc, indent=2, allow_nan=False)
    # NOTE: one line per metric (its per-seed values side by side), not one per value:
    # the file stays reviewable and a diff shows which metric moved.
    text = _FLAT_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    return text + "\n"


_FLAT_LIST = re.compile(r"\[\n\s+([-+0-9.eEnul, \n]*?|[\"a-z_, \n]*?)\n\s*\]")  # numbers/nulls, or names


def _is_metric(key: str, v: Any) -> bool:
    # NOTE: a null latency (no measured request had it) is recorded as null, so the
    # gate later says "not evaluable" instead of "not in the baseline".
    return isinstance(v, (int, float)) and not isinstance(v, bool) or v is None and key.endswith("_ms")


def _entry(scenario: Scenario, inputs: dict[str, str], summaries: list[dict], seeds: list[int]) -> dict:
    """A baseline entry: per metric, one value per seed (in ``seeds`` order)."""
    first = summaries[0]
    metrics = {k: [s.get(k) if _is_metric(k, s.get(k)) else None for s in summaries]
               for k, v in first.items() if _is_metric(k, v)}
    entry = {"name": scenario.name, "policy": first.get("policy", ""),
             "batchsim_version": __version__, "scenario_hash": combine_hash(inputs),
             "inputs": inputs, "seeds": seeds, "metrics": metrics}
    engines = [str(s.get("engine")) for s in summaries]
    if any("engine" in s for s in summaries):
        # which engine ran (the compiled core, or the SimPy engine it fell back to): one name, or one per seed
        entry["engine"] = engines[0] if len(set(engines)) == 1 else engines
    return entry


# --------------------------------------------------------------------- gate


def parse_metrics(values: Iterable[str] | None) -> tuple[str, ...]:
    """``--metrics`` values (repeatable, comma-separated) -> unique keys; default set if not given.

    Given but naming nothing (``--metrics ,``) is an InputError, not the default set."""
    keys: list[str] = []
    given = list(values or ())
    for v in given:
        for k in v.split(","):
            k = k.strip()
            if k and k not in keys:
                keys.append(k)
    if given and not keys:
        raise InputError(f"got {', '.join(map(repr, given))}; expected summary keys such as "
                         f"{', '.join(DEFAULT_METRICS[:3])}", "--metrics")
    return tuple(keys) or DEFAULT_METRICS


def _check_metrics(metrics: tuple[str, ...], summary: dict, base: dict | None, source: str) -> None:
    """Every chosen metric is a numeric summary key (in this run or the baseline entry); a list,
    a mapping or a string (``policy``, ``warnings``, ``provenance``) is not a metric."""
    numeric = [k for k, v in summary.items() if _is_metric(k, v)]
    known = set(numeric) | set(base or ())
    unknown = [m for m in metrics if m not in known]
    if unknown:
        what = "not a numeric summary key" if all(m in summary for m in unknown) else "unknown metric"
        raise InputError(f"{what} {', '.join(map(repr, unknown))} (in {source}); expected numeric summary keys "
                         f"such as {', '.join(sorted(numeric))}", "--metrics")


def _explain(old: dict, inputs: dict[str, str], new_hash: str) -> str:
    old_inputs = old.get("inputs") or {}
    moved = sorted(k for k in set(old_inputs) | set(inputs) if old_inputs.get(k) != inputs.get(k))
    what = f" (changed: {', '.join(moved)})" if moved and old_inputs else ""
    return (f"scenario inputs changed since the baseline was recorded{what}: hash "
            f"{old.get('scenario_hash', '?')} -> {new_hash}; metrics below are shown for "
            "information but the scenario fails until the baseline is re-recorded with --update")


@dataclass
class _Run:
    key: str
    scenario: Scenario
    inputs: dict[str, str]
    summaries: list[dict]  # one per seed
    seeds: list[int]
    seconds: float

    @property
    def per_seed(self) -> dict[str, list]:
        """Each summary key of the first seed -> its value in every seed."""
        return {k: [s.get(k) for s in self.summaries] for k in self.summaries[0]}


def _run_one(path: Path, baseline: Path, runner: Runner, seeds: int) -> _Run:
    from batchsim.app.compare import with_seed

    scenario = load_scenario(path)
    base_dir = path.resolve().parent
    # (a bad field found while hashing or running is named with its file, as batchsim run names it)
    inputs = naming_file(path, scenario_inputs, scenario, base_dir)
    t0 = time.perf_counter()
    runs = [with_seed(scenario, i) for i in range(seeds)]  # compare's rule: seed + i
    summaries = [naming_file(path, runner, s, base_dir) for s in runs]
    return _Run(scenario_key(path, baseline), scenario, inputs, summaries, [s.seed for s in runs],
                time.perf_counter() - t0)


def _thin(metrics: dict, min_requests: int) -> str:
    """Why a summary (or a baseline's metrics) is not evaluable ("" when it is, or does not say).

    ``completed`` may be one value or one per seed: the thinnest seed decides."""
    done = metrics.get("completed")
    values = done if isinstance(done, list) else [done]
    if not values or not all(isinstance(d, (int, float)) and not isinstance(d, bool) for d in values):
        return ""
    return thin_window(int(min(values)), min_requests)


def _old_seeds(old: dict, scenario: Scenario) -> list[int]:
    """The seeds of a baseline entry; an old one-seed entry holds the scenario's own seed."""
    return list(old["seeds"]) if isinstance(old.get("seeds"), list) else [scenario.seed]


def _pairing(run: _Run, old: dict) -> tuple[dict, dict, bool, str]:
    """The two sides to compare, whether they are paired, and a note on how.

    Seeds both sides hold are paired seed by seed (common random numbers), the others are left
    out; with no shared seed the two sides are compared unpaired."""
    old_seeds = _old_seeds(old, run.scenario)
    shared = [s for s in run.seeds if s in old_seeds]
    base = {k: (v if isinstance(v, list) else [v]) for k, v in old["metrics"].items()}
    cur = run.per_seed
    head = f"baseline seeds {_seed_text(old_seeds)}, this run {_seed_text(run.seeds)}"
    if not isinstance(old.get("seeds"), list):
        head = (f"baseline entry holds one seed (old format, one value per metric), taken as the scenario's seed "
                f"{run.scenario.seed}; re-record with --update to store every seed; this run {_seed_text(run.seeds)}")
    if not shared:
        how = ("no seed shared, so the two sides are compared unpaired (Welch's t-test, a much weaker test)"
               if len(old_seeds) > 1 and len(run.seeds) > 1 else
               "no seed shared and a side holds a single seed, which has no interval: not evaluable")
        return base, cur, False, f"{head}: {how}"
    bi = [old_seeds.index(s) for s in shared]
    ci = [run.seeds.index(s) for s in shared]
    base = {k: [v[i] for i in bi] for k, v in base.items()}
    cur = {k: [v[i] for i in ci] for k, v in cur.items()}
    if shared == old_seeds == run.seeds and isinstance(old.get("seeds"), list):
        return base, cur, True, ""
    if len(shared) == 1:
        how = (f"compared on the one seed both hold ({shared[0]}), exactly: no interval, a deterministic check "
               "outside the Holm family")
    else:
        how = f"paired on the {len(shared)} seeds both hold ({_seed_text(shared)}); the others are left out"
    return base, cur, True, f"{head}: {how}"


def _engine_notes(run: _Run, old: dict | None) -> tuple[list[str], str]:
    """Notes on the engine each seed ran on (the baseline's engine, a fallback's reason) and the
    engine's provenance text."""
    old_engine = (old or {}).get("engine")
    old_seeds = _old_seeds(old, run.scenario) if old else []
    groups: dict[tuple, list[int]] = {}
    for seed, s in zip(run.seeds, run.summaries):
        engine, why = s.get("engine"), s.get("engine_reason")
        if isinstance(old_engine, list):
            was = old_engine[old_seeds.index(seed)] if seed in old_seeds else None
        else:
            was = old_engine
        if engine is None:
            continue
        groups.setdefault((engine, was, why), []).append(seed)
    notes = []
    for (engine, was, why), seeds in groups.items():
        if (was is not None and was != engine) or why:
            base = f" (the baseline's: {was})" if was is not None and was != engine else ""
            notes.append(f"engine: seeds {_seed_text(seeds)} ran on the {engine} engine{base}"
                         + (f": {why}" if why else ""))
    engines = sorted({e for e, _, _ in groups})
    olds = sorted({w for _, w, _ in groups if w is not None})
    text = ", ".join(engines) + (f" (baseline: {', '.join(olds)})" if olds and olds != engines else "")
    return notes, text


def _provenance(run: _Run, engine: str) -> tuple[tuple[str, str], ...]:
    """What produced the verdict, from the first seed's summary provenance and the run's seeds."""
    prov = run.summaries[0].get("provenance") or {}
    out: list[tuple[str, str]] = []
    for key in ("model", "hardware", "calibrated_profile", "tensor_parallel_size", "dtype", "kv_cache_dtype",
                "replicas", "router", "engine_preset", "policy", "arrival", "requests"):
        if key in prov:
            v = prov[key]
            out.append((key, v if isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(",", ":"))))
    out.append(("engine", engine or "?"))
    reasons = list(dict.fromkeys(s["engine_reason"] for s in run.summaries if s.get("engine_reason")))
    if reasons:  # (why the compiled core did not run: the SimPy engine ran instead)
        out.append(("engine_reason", "; ".join(reasons)))
    out += [("batchsim_version", __version__), ("run_seeds", ",".join(map(str, run.seeds)))]
    return tuple(out)


def _identical(run: _Run, old: dict | None, fresh: dict) -> tuple[bool, str]:
    """Whether re-recording would leave the entry as it is (same seeds, engine and every value)."""
    if old is None:
        return False, ""
    same = {k: old.get(k) == fresh.get(k) for k in ("seeds", "engine", "scenario_hash", "batchsim_version")}
    moved = [(k, i) for k, vs in fresh["metrics"].items() for i, v in enumerate(vs)
             if not isinstance(old["metrics"].get(k), list) or i >= len(old["metrics"][k]) or old["metrics"][k][i] != v]
    gone = sorted(set(old["metrics"]) - set(fresh["metrics"]))
    if all(same.values()) and not moved and not gone:
        return True, ""
    what = [f"{k} ({old.get(k)!r} -> {fresh.get(k)!r})" for k, v in same.items() if not v]
    if moved:
        k, i = moved[0]
        what.append(f"{len(moved)} recorded value(s) (first: {k} at seed {fresh['seeds'][i]}: "
                    f"{old['metrics'][k][i] if isinstance(old['metrics'].get(k), list) and i < len(old['metrics'][k]) else None!r}"
                    f" -> {fresh['metrics'][k][i]!r})")
    if gone:
        what.append(f"metrics no longer in the summary: {', '.join(gone)}")
    return False, ("not identical to the baseline entry: a re-record (--update) would change "
                   + "; ".join(what))


def _diff(run: _Run, old: dict | None, fresh: dict, metrics: tuple[str, ...], rtol: float,
          update: bool, min_requests: int = MIN_REQUESTS) -> ScenarioDiff:
    """The scenario's comparison with the baseline entry ``old`` (``fresh``: this run's entry), its
    statistical checks still undecided (``regress`` decides every scenario's together)."""
    new_hash = fresh["scenario_hash"]
    problems: list[str] = []
    notes: list[str] = []
    remedy = ("; not a pass: give the scenario more requests (workload.num_requests) or a shorter "
              "measure.warmup_s/cooldown_s, then re-record")
    thin = _thin(run.per_seed, min_requests)
    if thin:
        problems.append(f"not evaluable in this run: {thin}{remedy}")
    thin = _thin(old["metrics"], min_requests) if old is not None else ""
    if thin:
        problems.append(f"not evaluable in the baseline: {thin}{remedy}")
    if old is None:
        problems.append("no baseline entry for this scenario; record it with --update")
        diffs = measure(None, run.per_seed, metrics, rtol)
    else:
        if old.get("scenario_hash") != new_hash:
            problems.append(_explain(old, run.inputs, new_hash))
        base, cur, paired, how = _pairing(run, old)
        if how:
            notes.append(how)
        version = old.get("batchsim_version")
        if version != __version__:
            notes.append(f"baseline recorded with batchsim {version}, this is {__version__}: "
                         "compared anyway; a difference may come from the version change")
        diffs = measure(base, cur, metrics, rtol, paired=paired)
    engine_notes, engine = _engine_notes(run, old)
    notes += engine_notes
    notes += [f"run warning: {w}" for w in _seed_warnings([s.get("warnings") for s in run.summaries])]
    identical, why = _identical(run, old, fresh)
    if why and not update:
        notes.append(why)
    if update:
        if old is None:
            problems = [p for p in problems if not p.startswith("no baseline entry")]
            notes = ["recorded a new baseline entry"] + notes
            diffs = tuple(replace(d, status="new") for d in diffs)
        notes.extend(f"accepted by --update: {p}" for p in problems)
        problems = []
    return ScenarioDiff(run.key, run.scenario.name, diffs, tuple(problems), tuple(notes),
                        new_hash, (old or {}).get("scenario_hash", ""), run.seconds,
                        provenance=_provenance(run, engine), identical=identical)


def _seed_text(seeds: list) -> str:
    return f"{seeds[0]}..{seeds[-1]}" if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[0] + len(seeds))) \
        else ",".join(map(str, seeds)) or "none"


def reproduce_command(paths: Iterable[str | Path], baseline: str | Path, *, rtol: float, seeds: int,
                      min_requests: int, metrics: tuple[str, ...], update: bool = False) -> str:
    """The ``batchsim regress`` command that gives the same verdict (every option that decides it)."""
    args = ["batchsim", "regress", *map(str, paths), "--baseline", str(baseline), "--seeds", str(seeds),
            "--rtol", f"{rtol:g}", "--min-requests", str(min_requests)]
    if metrics != DEFAULT_METRICS:
        args += ["--metrics", ",".join(metrics)]
    return shlex.join(args + (["--update"] if update else []))


def regress(scenarios: Iterable[str | Path], baseline: str | Path, *, update: bool = False,
            rtol: float = 0.02, metrics: Iterable[str] | None = None,
            runner: Runner | None = None, min_requests: int = MIN_REQUESTS,
            seeds: int = DEFAULT_SEEDS, write: bool = True) -> RegressionReport:
    """Re-run each scenario with ``seeds`` seeds, compare against ``baseline``; with ``update``, rewrite it.

    Seed ``i`` is ``scenario.seed + i`` (compare's ``with_seed``). Every statistical check of
    every scenario is decided as one family (:func:`batchsim.reports.regression.decide`).
    Raises :class:`InputError` (exit 2) for bad input: a missing or malformed baseline
    without ``update``, an unreadable scenario, an unknown or non-numeric metric, an
    ``rtol`` that is negative or not finite, ``seeds`` < 1. Regressions are in the report.
    ``write=False`` leaves the baseline file alone and puts its new text in the report's
    ``baseline_text`` (the CLI writes it with the other outputs, as one set).
    """
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not (math.isfinite(rtol) and rtol >= 0):
        raise InputError(f"got {rtol!r}; expected a finite number >= 0", "--rtol")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise InputError(f"must be a whole number >= 1, got {seeds!r}", "--seeds")
    if isinstance(min_requests, bool) or not isinstance(min_requests, int) or min_requests < 1:
        raise InputError(f"must be a whole number >= 1, got {min_requests!r}", "--min-requests")
    keys = parse_metrics(metrics)
    bpath = Path(baseline)
    by_key: dict[str, Path] = {}
    for p in scenarios:  # the same file named twice (overlapping globs) runs once
        by_key.setdefault(scenario_key(Path(p), bpath), Path(p))
    paths = list(by_key.values())
    if not paths:
        raise InputError("no scenario files given", "SCENARIO")
    if update and not bpath.exists():
        entries: dict[str, dict] = {}
    else:
        entries = load_baseline(bpath)
    run = runner or _default_runner
    results: list[ScenarioDiff] = []
    fresh: dict[str, dict] = {}
    cmd = dict(baseline=bpath, rtol=rtol, seeds=seeds, min_requests=min_requests, metrics=keys)
    for path in paths:
        r = _run_one(path, bpath, run, seeds)
        old = entries.get(r.key)
        _check_metrics(keys, r.summaries[0], old and old["metrics"], str(path))
        fresh[r.key] = _entry(r.scenario, r.inputs, r.summaries, r.seeds)
        d = _diff(r, old, fresh[r.key], keys, rtol, update, min_requests)
        results.append(replace(d, command=reproduce_command([path], **cmd), run_commands=tuple(
            shlex.join(["batchsim", "run", str(path), "--set", f"seed={s}"]) for s in r.seeds)))
    decided = decide([s.diffs for s in results])
    results = [replace(s, diffs=d) for s, d in zip(results, decided)]
    notes: list[str] = []
    text = None
    if update:
        text = baseline_text({**entries, **fresh})
        if write:
            atomic_write_text(bpath, text)
        notes.append(f"baseline {bpath} updated: {len(fresh)} scenario(s) recorded")
    unchecked = sorted(set(entries) - set(fresh))
    if unchecked and not update:
        notes.append(f"baseline entries not checked in this run: {', '.join(unchecked)}")
    command = reproduce_command(paths, **cmd)
    return RegressionReport(tuple(results), rtol, str(bpath), update, tuple(notes), seeds,
                            command=command, baseline_text=text)
