"""The composition root: scenario -> parts -> run -> records -> summary.

Only this module (and the CLI above it) wires packages together: it builds
the workload, the cost model, the KV caches, the policies and the router,
runs SimPy, and turns what happened into records and a summary.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import simpy
from pydantic import ValidationError

from batchsim import policies
from batchsim.calibrate.costmodel import RooflineCostModel
from batchsim.calibrate.hardware import load_hardware
from batchsim.calibrate.models import load_model
from batchsim import __version__, core
from batchsim.app.config import Scenario
from batchsim.engines import preset_report
from batchsim.sim.engine import Cluster, Replica
from batchsim.sim.protocols import PolicyError
from batchsim.sim.io import TableFile, write_json, write_set, write_table
from batchsim.sim.errors import InputError
from batchsim.sim.kv import PagedKVCache
from batchsim.sim.prefix import PrefixKVCache
from batchsim.sim.metrics import RunTotals, ms_piece, summarize
from batchsim.sim.protocols import CostModel
from batchsim.sim.aggregate import StepTotals
from batchsim.sim.itl import ItlAhead, ItlRecords, TokenSteps
from batchsim.sim.frontend import engine_arrivals
from batchsim.sim.records import (AutoSteps, FrameSteps, StepStream, TimelineSteps, add_latencies, empty_requests,
                                  empty_step_table, request_frame)
from batchsim.sim.router import make_router
from batchsim.sim.state import UNFINISHED, Seq
from batchsim.sim.table import Table, as_table, column
from batchsim.sim.types import Workload
from batchsim.workloads import build_workload, trace_notes

__all__ = ["RunResult", "Parts", "build_parts", "choose_engine", "kv_limits", "run_scenario", "run_to_folder", "simulate", "write_outputs",
           "choose_format", "AUTO_LARGE_REQUESTS", "AUTO_STEP_ROWS", "STEP_MODES"]


@dataclass
class Parts:
    """What a scenario builds before the run (reusable across policies)."""

    workload: Workload
    cost: CostModel
    kv_tokens: Any  # callable gpu_memory_utilization -> tokens per replica
    max_model_len: int
    meta: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what reading the workload changed (trace_notes): every run's summary warns of it


@dataclass(eq=False)  # (two runs are the same run only if they are one object: frames have no truth value)
class RunResult:
    """Everything a run produced: the summary and the flat records.

    ``requests`` and ``steps`` are given as numpy columns (batchsim.sim.table.Table, what the run
    makes) or as pandas frames, and read as pandas frames, made when first read, so a run that only
    writes its files never imports pandas. Once a frame was read it is the records (an edit to it
    reaches :func:`write_outputs`); :attr:`request_table` and :attr:`step_table` are the records
    as columns either way."""

    scenario: Scenario
    summary: dict
    requests: Any
    steps: Any
    itl: ItlRecords  # every gap (batchsim.sim.itl): .weighted(), .frame() for one row per gap
    meta: dict
    engine: dict = field(default_factory=dict)  # how the engine ran (not a result: may differ by mode)

    @property
    def request_table(self) -> Table:
        """The request records as columns (for reading: once the frame was read, a new Table of
        it each time; edit :attr:`requests`)."""
        return as_table(self.__dict__["_requests"])

    @property
    def step_table(self) -> Table:
        """The step records as columns (as :attr:`request_table`)."""
        return as_table(self.__dict__["_steps"])

    def records(self, name: str):
        """The ``requests`` or ``steps`` records as they are held: a Table, or the frame once read."""
        return self.__dict__[f"_{name}"]


def _records(name: str) -> property:
    """A RunResult records attribute: stored as given, read as a pandas frame (made once)."""
    key = f"_{name}"

    def get(self):
        value = self.__dict__[key]
        if isinstance(value, Table):
            value = self.__dict__[key] = value.to_pandas()
        return value

    def put(self, value) -> None:
        self.__dict__[key] = value

    return property(get, put, doc=f"The {name} records as a pandas frame.")


RunResult.requests = _records("requests")  # (after the dataclass made __init__, which assigns them)
RunResult.steps = _records("steps")


def _seeds(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    wl, router = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(wl), np.random.default_rng(router)


def _hardware(scenario: Scenario):
    """The scenario's hardware profile, with its ``overheads`` terms in place of the profile's."""
    hw = load_hardware(scenario.hardware)
    updates = scenario.overheads.updates()
    if not updates:
        return hw
    data = hw.model_dump(mode="json")
    for field, terms in updates.items():
        data[field] = {**data.get(field, {}), **terms}
    try:
        return type(hw).model_validate(data)
    except ValidationError as e:
        # NOTE: each term passed its own bounds in the scenario; what fails here is a check across
        # terms (host_overhead's per_step_us + per_decode_step_us >= 0), with the profile's values
        # filling the terms the scenario left unset: name the section as the scenario spells it.
        err = e.errors()[0]
        loc = [str(p) for p in err.get("loc", ())]
        section = {"host_overhead": "host", "frontend": "frontend"}.get(loc[0], loc[0]) if loc else ""
        where = ".".join(["overheads", section, *loc[1:]]) if section else "overheads"
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        raise InputError(f"{msg} (the terms not set here are hardware profile {hw.name}'s)", where) from None


def build_cost(scenario: Scenario) -> RooflineCostModel:
    """The scenario's cost model: its model, hardware (with its overhead terms), TP and dtypes."""
    model = load_model(scenario.model)
    hw = _hardware(scenario)
    kv_dtype = scenario.kv_cache_dtype
    if kv_dtype == "auto":  # vLLM's auto: KV in the activation dtype, bf16 for quantized weights
        kv_dtype = "fp16" if scenario.dtype == "fp16" else "bf16"
    tp = scenario.tensor_parallel_size
    try:
        cost = RooflineCostModel(model, hw, tp=tp, dtype=scenario.dtype, kv_dtype=kv_dtype)
    except InputError as e:
        if not (e.where or "").startswith("--tp "):
            raise
        # NOTE: the cost model names the cost command's --tp; here the size came from the scenario.
        message = e.message.replace(f"tp={tp}", f"tensor_parallel_size={tp}")
        raise InputError(f"{message} for {getattr(model, 'name', scenario.model)}", "tensor_parallel_size") from None
    return cost


def build_parts(scenario: Scenario, base_dir: Path | None = None,
                workload: Workload | None = None) -> Parts:
    """Load the model, hardware and cost model, and generate the workload."""
    cost = build_cost(scenario)
    model, hw = cost.model, cost.hardware
    notes: list[str] = []
    if workload is None:
        with trace_notes() as notes:  # (a trace's notes go in every run's summary)
            workload = build_workload(scenario.workload, _seeds(scenario.seed)[0], base_dir)
    meta = {
        "batchsim_version": __version__,
        "scenario": scenario.name,
        "model": getattr(model, "name", scenario.model),
        "hardware": getattr(hw, "name", scenario.hardware),
        "calibrated": bool(getattr(hw, "calibrated", False)),
        "tensor_parallel_size": scenario.tensor_parallel_size,
        "dtype": scenario.dtype,
        "replicas": scenario.replicas,
        "seed": scenario.seed, **({"engine_preset": scenario.engine_preset} if scenario.engine_preset else {}),
    }
    return Parts(workload=workload, cost=cost, kv_tokens=cost.kv_capacity_tokens,
                 max_model_len=int(model.max_position_embeddings), meta=meta, notes=tuple(notes))


def kv_limits(cfg) -> dict[str, int]:
    """The policy limits that size a replica's activation reserve (and so its KV)."""
    limits = {k: getattr(cfg, k) for k in ("max_num_batched_tokens", "max_num_seqs") if hasattr(cfg, k)}
    if "max_num_seqs" not in limits and hasattr(cfg, "max_batch_size"):
        limits["max_num_seqs"] = cfg.max_batch_size
    if getattr(cfg, "gpu_memory_utilization_of", "total") != "total":
        limits["memory_of"] = cfg.gpu_memory_utilization_of
    return limits


def _kv_cache(parts: Parts, cfg) -> PagedKVCache:
    blocks = parts.kv_tokens(cfg.gpu_memory_utilization, **kv_limits(cfg)) // cfg.block_size
    if not getattr(cfg, "enable_prefix_caching", False):
        return PagedKVCache(blocks, cfg.block_size)
    wl = parts.workload
    if wl.prefix_hashes is None or not wl.prefix_block_tokens:
        raise InputError("enable_prefix_caching needs prefix hashes in the workload (a Mooncake "
                         "trace's hash_ids, or workload.shared_prefix: {groups, tokens})", "policy.enable_prefix_caching")
    return PrefixKVCache(blocks, cfg.block_size, wl.prefix_block_tokens)


def _summed_ahead(scenario: Scenario) -> bool:
    """Whether the ITL summary's first pass is made as the core's run goes (batchsim.sim.itl.ItlAhead):
    one replica, and every request's gaps measured unless it fails (no horizon, no warm-up or
    cool-down). Either way the summary is the same; the pass made ahead is used only when the
    gaps it summed are exactly those measured (ItlRecords.select), else made after the run."""
    m = scenario.measure
    return (scenario.replicas == 1 and scenario.horizon_s is None and not (m.warmup_s or m.cooldown_s)
            and not (m.warmup_requests or m.cooldown_requests))


def choose_engine(scenario: Scenario, policy, parts: Parts, replica, kv_type, others=()) -> str | None:
    """None when the compiled core runs this scenario, else why the SimPy engine runs it.

    The core runs only what it can show it runs with the same rules
    (batchsim.core.unsupported, batchsim.core.rules); ``engine: core`` makes any reason an
    error instead.
    """
    if scenario.engine == "python":
        return "engine: python was asked for"
    why = core.unsupported(policy, parts.cost, scenario.router, replica, kv_type, parts.workload,
                           scenario.max_queue_len, others)
    if why is None and core.library() is None:
        why = f"the compiled core could not be built ({core.library_error()})"
    if why is None:
        why = core.rules_mismatch()
    if why is not None and scenario.engine == "core":
        raise InputError(f"core cannot run this scenario: {why}", "engine")
    return why


@contextmanager
def _policy_contract(scenario: Scenario, policy):
    """A policy of the user's own that breaks the engine contract (a PolicyError, such as a
    ``schedule`` that returns no BatchPlan) is bad input: one line naming it. A shipped policy's
    PolicyError is a batchsim bug and keeps its traceback."""
    try:
        yield
    except PolicyError as e:
        if type(policy).__module__.partition(".")[0] == "batchsim":
            raise
        detail = str(e).removeprefix(f"{getattr(policy, 'name', '')}: ")
        raise InputError(f"{scenario.policy.get('name')!r} broke the engine contract: {detail}", "policy") from e


def _check_max_model_len(cfg, parts: Parts) -> None:
    """A ``max_model_len`` past the model's context is an error, as in vLLM (not a silent clip)."""
    asked = getattr(cfg, "max_model_len", None)
    if asked is not None and asked > parts.max_model_len:
        model = parts.meta.get("model", "the model")
        raise InputError(f"got {asked}, above {model}'s context length (max_position_embeddings "
                         f"{parts.max_model_len}); expected at most {parts.max_model_len}", "policy.max_model_len")


def simulate(scenario: Scenario, parts: Parts, replica: Callable[..., Replica] = Replica,
             step_sink: Any = "memory") -> RunResult:
    """Run one scenario's policy over prebuilt parts.

    ``replica`` builds each replica from ``(env, index, policy, cost, kv,
    max_model_len, steps, itl)``; the reference executor passes a
    :class:`~batchsim.sim.engine.Replica` subclass that times real steps.

    ``step_sink``: where the step records go as the run makes them (batchsim.sim.records.StepStream):
    ``"memory"`` keeps them as ``RunResult.steps`` (none with ``measure.records: aggregate``);
    ``None`` keeps none; a sink (``write(chunk)``, ``close()``: e.g. a batchsim.sim.io.TableFile)
    takes them a chunk at a time, so a long run's memory does not grow with its steps. The
    summary's step sums come from running totals either way.
    """
    if scenario.disaggregation is not None:
        from batchsim.app.disagg import simulate_disagg

        return simulate_disagg(scenario, parts, replica, step_sink)
    aggregate = scenario.measure.records == "aggregate"
    client_arrival = parts.workload.arrival  # (when the clients sent their requests)
    if isinstance(step_sink, str):
        step_sink = None if aggregate else FrameSteps()
    step_totals = StepTotals(scenario.replicas)
    steps = StepStream(step_totals, step_sink)
    pols = [policies.create_policy(scenario.policy) for _ in range(scenario.replicas)]
    _check_max_model_len(pols[0].config, parts)
    caches = [_kv_cache(parts, p.config) for p in pols]
    max_len = min(parts.max_model_len, pols[0].config.max_model_len or parts.max_model_len)
    fe = getattr(parts.cost, "frontend", None)
    engine_wl = parts.workload  # (what the engine's queue receives: an open loop past the frontend)
    if fe is not None and engine_wl.closed is None:
        engine_wl = replace(engine_wl, arrival=engine_arrivals(engine_wl.arrival, engine_wl.prompt_tokens, fe[0], fe[1],
                                                               servers=scenario.replicas))
        parts = replace(parts, workload=engine_wl)
    why = choose_engine(scenario, pols[0], parts, replica, type(caches[0]), pols[1:])
    use_core = why is None
    if use_core:
        with _policy_contract(scenario, pols[0]):
            ran = core.run_core(parts.workload, pols[0], parts.cost, [c.total_blocks for c in caches],
                                caches[0].block_size, max_len, scenario.router, scenario.horizon_s,
                                scenario.max_queue_len, steps, router_rng=_seeds(scenario.seed)[1],
                                itl_ahead=ItlAhead(ms_piece) if _summed_ahead(scenario) else None)
        requests, now, itl = ran.requests, ran.now, ran.itl
        for c, peak in zip(caches, ran.kv_peak):
            c.peak_used = peak
        unfinished = int((requests["status"] == UNFINISHED).sum())  # (a Table's column)
        if unfinished != ran.held:
            raise RuntimeError(f"conservation broken: {unfinished} unfinished request(s) but {ran.held} "
                               "queued or running")
        engine = {"steps": ran.steps, "engine": "core", "held": ran.held}
        sent = parts.workload.arrival
    else:
        env = simpy.Environment()
        replicas = [replica(env, i, pol, parts.cost, kv, max_len, steps, TokenSteps())
                    for i, (pol, kv) in enumerate(zip(pols, caches))]
        route = make_router(scenario.router, _seeds(scenario.seed)[1])
        cluster = Cluster(env, replicas, route, parts.workload, scenario.max_queue_len)
        with _policy_contract(scenario, pols[0]):
            env.run(until=scenario.horizon_s)
        _check_unfinished_are_held(cluster)
        requests, now = request_frame(cluster.requests), env.now
        itl = _itl_records(replicas, cluster.requests, len(parts.workload))
        engine = {"steps": len(steps), "engine": "python"}
        sent = cluster.arrival  # (a closed loop's send times; inf for requests never sent)
    kv0 = caches[0]

    def totals_of(sim_end: float) -> RunTotals:
        return RunTotals(
            replicas=scenario.replicas, sim_end=sim_end, peak_flops=parts.cost.peak_flops,
            peak_bandwidth=parts.cost.peak_bandwidth, kv_total_blocks=kv0.total_blocks,
            kv_peak_blocks=max(c.peak_used for c in caches),
            warmup_s=scenario.measure.warmup_s, cooldown_s=scenario.measure.cooldown_s,
            warmup_requests=scenario.measure.warmup_requests, cooldown_requests=scenario.measure.cooldown_requests,
        )

    requests, step_df, itl, summary, _ = conclude(
        scenario, parts, requests, itl, now, sent, cluster.sent if parts.workload.closed is not None else None,
        client_arrival, steps, step_sink, step_totals, totals_of, pols[0].name)
    if kv0.prefix_caching:
        hits, looks = sum(c.hits for c in caches), sum(c.lookups for c in caches)
        summary["prefix_cache_hit_rate"] = hits / looks if looks else 0.0
    if scenario.replicas > 1:
        summary.update(_per_replica(requests, scenario.replicas))
    if parts.notes:
        summary["warnings"] = [*parts.notes, *summary.get("warnings", [])]
    summary["engine"] = "core" if use_core else "python"
    summary["engine_reason"] = why
    if scenario.overheads.updates() or fe is not None:  # (else the profile's terms, as its name says)
        summary["overheads"] = overhead_terms(parts.cost)
    preset = preset_report(scenario)
    if preset is not None:
        summary["engine_preset"] = preset
    meta = dict(parts.meta, policy=pols[0].name, kv_blocks=kv0.total_blocks,
                block_size=kv0.block_size, kv_capacity_tokens=kv0.total_blocks * kv0.block_size)
    summary["provenance"] = provenance(scenario, parts, pols[0], meta, max_len, summary["engine"])
    if not math.isfinite(summary["duration_s"]):  # pragma: no cover - defensive
        raise RuntimeError("non-finite duration")
    return RunResult(scenario, summary, requests, step_df, itl, meta, engine)


def conclude(scenario: Scenario, parts: Parts, requests, itl: ItlRecords, now: float,
             sent: np.ndarray, client_sent: np.ndarray | None, client_arrival: np.ndarray, steps: StepStream,
             step_sink: Any, step_totals: StepTotals, totals_of: Callable[[float], RunTotals],
             policy_name: str) -> tuple[Table, Table, ItlRecords, dict, float]:
    """A run's records and summary from what its engine left (``requests``: a Table, or the
    SimPy engine's pandas frame): the request records as the clients saw them (``sent``: when
    each request reached the engine; ``client_sent``: a closed loop's send times), conservation
    checked, the step records closed, and the summary over ``totals_of(sim_end)``. Returns
    (requests, steps, gaps, summary, sim_end), the records as Tables."""
    requests = as_table(requests)
    if not len(requests):  # (a frame of no rows has no column types: each gets its own)
        typed = empty_requests()
        requests = Table({c: typed[c] if c in typed else requests[c] if requests[c].dtype != object else np.empty(0)
                          for c in requests.columns})
    fe = getattr(parts.cost, "frontend", None)
    workload = parts.workload if sent is parts.workload.arrival else replace(parts.workload, arrival=sent)
    client = client_sent if parts.workload.closed is not None else client_arrival
    if fe is not None:
        requests = _client_times(requests, client)
    _check_conservation(requests, workload, scenario.horizon_s)
    # (the records in one canonical order, by end time then replica, whatever order SimPy resumed
    # replicas that end a step at the same time in: StepStream)
    steps.close()
    step_df = step_sink.table() if isinstance(step_sink, FrameSteps) else empty_step_table()
    if fe is not None and scenario.horizon_s is not None:
        requests, itl = _frontend_horizon(requests, itl, client, parts.workload, scenario.horizon_s)
    unfinished = bool((requests["status"] == UNFINISHED).any()) if len(requests) else False
    # (every request of an open loop; those its clients sent, of a closed one)
    n_sent = (int(np.isfinite(client_sent).sum()) if parts.workload.closed is not None
              else _arrived(workload, math.inf))
    last_end = step_totals.totals()["max_end"]
    last = max([last_end if last_end > -math.inf else 0.0,
                float(np.max(workload.arrival, where=np.isfinite(workload.arrival), initial=0.0))])
    sim_end = now if unfinished else last
    summary = summarize(requests, step_totals, itl, totals_of(sim_end), policy=policy_name,
                        slo=scenario.slo.limits())
    if workload.closed is not None:
        summary.setdefault("warnings", []).extend(_closed_loop_warnings(requests, workload, n_sent,
                                                                        scenario.horizon_s))
    return requests, step_df, itl, summary, sim_end


def _itl_records(replicas, seqs, n: int) -> ItlRecords:
    """The Python engine's gaps (batchsim.sim.itl): its replicas' token steps and closed runs, and
    each request's open run."""
    closed = [r for rep in replicas for r in rep.itl.closed]
    cols = list(zip(*closed)) if closed else [[]] * 5
    rep = np.full(n, -1, dtype=np.int64)
    start, end, entry = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.full(n, np.nan)
    for s in seqs:
        if s.run is not None:
            rep[s.rid], start[s.rid], end[s.rid], entry[s.rid] = s.run
    return ItlRecords.build([np.array(r.itl.times, dtype=np.float64) for r in replicas], cols, (rep, start, end, entry))


def _client_times(requests: Table, sent: np.ndarray) -> Table:
    """The request records as the clients saw them: ``arrival`` is when a request was sent, and
    ``frontend_in_s`` how long the frontend took to hand it to the engine (batchsim.sim.frontend);
    the latencies are recomputed from there (first token and completion are already the client's)."""
    requests = requests.copy()
    if not len(requests):
        requests["frontend_in_s"] = np.empty(0)
        return requests
    client = np.asarray(sent, dtype=np.float64)[column(requests, "rid", np.int64)]
    requests["frontend_in_s"] = column(requests, "arrival", np.float64) - client
    requests["arrival"] = client
    return add_latencies(requests)


def _frontend_horizon(requests: Table, itl: ItlRecords, sent: np.ndarray, workload: Workload,
                      horizon: float) -> tuple[Table, ItlRecords]:
    """What the clients have at ``horizon_s`` when a frontend stands between them and the engine:
    tokens the frontend streams after it are not theirs (a completion after it is unfinished, a
    first token after it is none, gaps ending after it are dropped), and
    requests sent before it but still in the frontend's queue are unfinished requests."""
    req = requests.copy()
    for col in ("first_token", "last_token", "completion"):
        values = column(req, col, np.float64).copy()
        values[values > horizon] = np.nan
        req[col] = values
    status = req["status"].copy()
    status[(status == "completed") & np.isnan(req["completion"])] = UNFINISHED
    req["status"] = status
    itl, lost = itl.clip(horizon)
    if len(lost):
        rid = column(req, "rid", np.int64)
        pos = np.searchsorted(rid, lost)  # (the records are by rid)
        top = column(req, "max_itl", np.float64).copy()
        top[pos] = itl.max_per_request(lost)
        req["max_itl"] = top
    seen = np.zeros(len(workload), dtype=bool)
    seen[column(req, "rid", np.int64)] = True
    waiting = np.flatnonzero(~seen & (np.asarray(sent, dtype=np.float64) < horizon))
    if len(waiting):  # (requests as the engines record them: batchsim.sim.records.request_frame)
        sent = np.asarray(sent, dtype=np.float64)
        rows = as_table(request_frame([Seq(int(i), float(sent[i]), int(workload.prompt_tokens[i]),
                                           int(workload.output_tokens[i])) for i in waiting.tolist()]))
        rows["frontend_in_s"] = np.full(len(rows), np.nan)
        for c in req.columns:  # (columns of a deployment's own, e.g. the KV transfer's: none yet)
            if c not in rows:
                kind = req[c].dtype.kind
                rows[c] = (np.full(len(rows), {"i": -1, "u": 0, "f": np.nan}[kind], dtype=req[c].dtype) if kind in "iuf"
                           else np.full(len(rows), None, dtype=object))
        req = Table.concat([req, rows.select(req.columns)]).sort_by("rid")
    return add_latencies(req), itl


def _closed_loop_warnings(requests: Table, workload: Workload, sent: int, horizon: float | None) -> list[str]:
    """What a closed loop's clients did that its numbers alone do not show."""
    out = []
    if sent < len(workload):
        # (without a horizon the run ended because every client waits on a request that never ends:
        # a stalled replica, which its own warning names)
        why = "horizon_s stopped the clients" if horizon is not None else "the clients stopped, each waiting on a request that never ended"
        out.append(f"{why}: {sent} of {len(workload)} requests were sent")
    rejected = int((requests["status"] == "rejected").sum()) if len(requests) else 0
    if rejected:
        out.append(f"{rejected} requests rejected in a closed loop: a rejected request frees its client at once, "
                   "so with little think time rejections come back to back")
    return out


def overhead_terms(cost) -> dict | None:
    """The host and frontend terms the cost model prices with (microseconds), or None for a cost
    model without a hardware profile."""
    hw = getattr(cost, "hardware", None)
    if hw is None:
        return None
    host = hw.host_overhead.model_dump()
    host["per_step_us_at_tp"] = hw.host_overhead.step_us(getattr(cost, "tp", 1))
    return {"host": host, "frontend": hw.frontend.model_dump()}


def provenance(scenario: Scenario, parts: Parts, policy, meta: dict, max_len: int, engine: str) -> dict:
    """What produced a run's numbers, so it can be told apart and reproduced: the resolved model,
    hardware, parallelism, dtypes, the policy's effective knobs (defaults included), the KV
    capacity, the workload's arrivals, the seed, batchsim's version, the engine, and a hash of
    the whole resolved scenario but its ``engine`` (equal hashes: the same simulation).
    ``arrival`` is what decided the arrival times: the trace when its file has them, else the
    arrival process (a ``lengths`` trace, ``vllm_bench`` with ``arrivals_from: arrival``, a
    closed loop); ``trace`` is the trace, whenever there is one."""
    resolved = scenario.model_dump(mode="json")
    resolved.pop("engine", None)  # (which engine runs never changes the numbers: not part of the hash)
    resolved.pop("engine_preset_values", None)  # (a record of what the preset filled: the policy holds it)
    wl = resolved.get("workload", {})
    # NOTE: was `trace or arrival`: a lengths trace at 4 and at 32 closed-loop clients read the same
    timed = scenario.workload.trace_has_arrivals
    return {
        "batchsim_version": __version__, "engine": engine,
        "scenario": scenario.name,
        "scenario_hash": hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()[:16],
        "model": meta.get("model", scenario.model), "hardware": meta.get("hardware", scenario.hardware),
        "calibrated_profile": meta.get("calibrated"),
        "tensor_parallel_size": scenario.tensor_parallel_size, "dtype": scenario.dtype,
        "kv_cache_dtype": getattr(parts.cost, "kv_dtype", scenario.kv_cache_dtype),
        "replicas": scenario.replicas, "router": scenario.router,
        "policy": policy.config.model_dump(mode="json"),
        "kv_blocks_per_replica": meta["kv_blocks"], "block_size": meta["block_size"],
        "kv_capacity_tokens_per_replica": meta["kv_capacity_tokens"], "max_model_len": max_len,
        "arrival": wl.get("trace") if timed else wl.get("arrival"),
        **({"trace": wl["trace"]} if wl.get("trace") else {}), "requests": len(parts.workload),
        "seed": scenario.seed, **({"engine_preset": scenario.engine_preset} if scenario.engine_preset else {}),
    }


def _arrived(workload: Workload, horizon: float | None) -> int:
    """How many requests arrive before the horizon (SimPy never runs events at it)."""
    if workload.closed is not None:  # (sent as the run went: in rid order, but a frontend pool may reorder them)
        return int((workload.arrival < (math.inf if horizon is None else horizon)).sum())
    return len(workload) if horizon is None else int(np.searchsorted(workload.arrival, horizon, "left"))


def _check_conservation(requests: Table, workload: Workload, horizon: float | None) -> None:
    """Every request that arrived is completed, rejected or unfinished: never lost."""
    arrived = _arrived(workload, horizon)
    status = column(requests, "status")
    accounted = sum(int((status == k).sum()) for k in ("completed", "rejected", "unfinished"))
    if len(requests) != arrived or accounted != arrived:
        raise RuntimeError(f"conservation broken: {arrived} arrived, {len(requests)} recorded, "
                           f"{accounted} completed + rejected + unfinished")


def _check_unfinished_are_held(cluster: Cluster) -> None:
    """An unfinished request must still be queued or running on some replica."""
    held = set()
    for r in cluster.replicas:
        held.update(r.seqs)
    lost = [s.rid for s in cluster.requests if s.status == UNFINISHED and s.rid not in held]
    if lost:
        raise RuntimeError(f"conservation broken: {len(lost)} unfinished request(s) held by no "
                           f"replica (rids {lost[:5]})")


def _per_replica(requests, n: int) -> dict:
    """Requests completed per replica and the imbalance max/mean (1.0 = even)."""
    done = requests[column(requests, "status") == "completed"]
    counts = np.bincount(column(done, "replica", np.int64), minlength=n)[:n]
    mean = counts.mean() if n else 0.0
    return {"per_replica_completed": [int(c) for c in counts],
            "load_imbalance": float(counts.max() / mean) if mean else 1.0}


def run_scenario(scenario: Scenario, base_dir: Path | None = None, keep_steps: bool = True) -> RunResult:
    """Build the parts and run (``keep_steps``: keep the step rows as ``RunResult.steps``; the
    summary is the same either way)."""
    return simulate(scenario, build_parts(scenario, base_dir), step_sink="memory" if keep_steps else None)


AUTO_LARGE_REQUESTS = 100_000
"""``--format auto``: a run of more requests writes Parquet (a million request rows take ~10 s as
CSV, well under a second as Parquet)."""
AUTO_STEP_ROWS = 250_000
"""``--steps auto``: a run of more steps writes a step timeline instead of a row per step (2.7M
step rows take ~25 s as CSV; a million requests through static batching make 240M steps, 5.4 GB
of Parquet)."""
STEP_MODES = ("rows", "timeline", "none")


def choose_format(fmt: str, requests: int) -> tuple[str, str]:
    """The records' format for ``--format fmt`` and a run of ``requests`` requests, and why ("" when
    the user chose it)."""
    if fmt != "auto":
        return fmt, ""
    large = requests > AUTO_LARGE_REQUESTS
    fmt = "parquet" if large else "csv"
    return fmt, f"{fmt} (--format auto: {requests:,} requests {'>' if large else '<='} {AUTO_LARGE_REQUESTS:,})"


TIMELINE_BINS = 10_000
"""``--timeline-s auto``: the shortest of :data:`TIMELINE_STEPS_S` that covers the arrivals in at
most this many bins per replica."""
TIMELINE_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


def timeline_bin(workload: Workload) -> float:
    """The ``--timeline-s auto`` bin for this workload (1 s for a closed loop: its arrivals are made
    as it runs)."""
    arrival = workload.arrival
    span = float(np.max(arrival, where=np.isfinite(arrival), initial=0.0)) if workload.closed is None else 0.0
    for b in TIMELINE_STEPS_S:
        if span / b <= TIMELINE_BINS:
            return float(b)
    return float(TIMELINE_STEPS_S[-1])


class _StepFile(TableFile):
    """steps.<fmt> written as the run makes the steps (a batchsim.sim.records.StepStream sink)."""

    def close(self, columns=None) -> Path:
        return super().close(empty_step_table())


def run_to_folder(scenario: Scenario, out_dir: str | Path, base_dir: Path | None = None, fmt: str = "auto",
                  command: str | None = None, steps: str = "auto", timeline_s: float | None = None) -> tuple[RunResult, dict]:
    """``batchsim run``: build, simulate and write the outputs (:func:`write_outputs`) with the step
    records streamed to their file as the run goes, so memory does not grow with steps:
    ``steps`` ``rows`` (one per step), ``timeline`` (one per replica per ``timeline_s`` seconds,
    batchsim.sim.records.TimelineSteps; None: :func:`timeline_bin`), ``none``, or ``auto`` (rows
    up to :data:`AUTO_STEP_ROWS` steps, else a timeline: batchsim.sim.records.AutoSteps). The
    format: :func:`choose_format`. ``measure.step_records: false`` or ``records: aggregate``
    write none. Returns the result (without step rows) and what was written (``format``,
    ``steps``, ``timeline_s``, ``why``, ``files``)."""
    parts = build_parts(scenario, base_dir)
    fmt, why_format = choose_format(fmt, len(parts.workload))
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:  # (say so before the run, not after it)
            raise InputError(f"Parquet needs pyarrow, which is not installed (pip install pyarrow){'; ' + why_format if why_format else ''}; "
                             "--format csv writes CSV", "--format") from None
    if not (scenario.measure.step_records and scenario.measure.records == "full"):
        steps = "none"
    given_bin = timeline_s is not None
    if timeline_s is None:
        timeline_s = timeline_bin(parts.workload)
    out = Path(out_dir).absolute()
    sink = None
    made: list[TableFile] = []  # (the step file, once a sink makes it)
    # (beside the output folder, named as write_set's temporary files are, so a killed run's is
    # removed by the next write to the same place: batchsim.sim.io.clean_orphans)
    where = out.parent / f".{out.name}.tmp-{os.getpid()}-steps.{fmt}"

    def rows():
        made.append(_StepFile(where, fmt))
        return made[-1]

    def timeline():
        made.append(TableFile(where, fmt))
        return TimelineSteps(made[-1], timeline_s)

    if steps == "rows":
        sink = rows()
    elif steps == "timeline":
        sink = timeline()
    elif steps == "auto":
        sink = AutoSteps(rows, timeline, AUTO_STEP_ROWS)
    try:
        result = simulate(scenario, parts, step_sink=sink)
        if command is not None:
            result.summary["provenance"]["command"] = command
        kept = sink.mode if isinstance(sink, AutoSteps) else steps
        why = [why_format] if why_format else []
        if steps == "auto":
            n = result.summary.get("num_steps", 0)
            why.append(("steps as a timeline" if kept == "timeline" else "a row per step")
                       + f" (--steps auto: {n:,} steps {'>' if kept == 'timeline' else '<='} {AUTO_STEP_ROWS:,})")
        if kept == "timeline" and not given_bin:
            why.append(f"a timeline row per {timeline_s:g} s (--timeline-s auto: at most {TIMELINE_BINS:,} over "
                       "the arrivals)")
        if kept != "timeline" and given_bin:
            why.append("--timeline-s unused: no timeline written")
        written = write_outputs(result, out, fmt, steps_path=made[0].path if made else None, why="; ".join(why),
                                steps=kept, timeline_s=timeline_s)
    except BaseException:
        for f in made:
            f.discard()
            f.path.unlink(missing_ok=True)
        raise
    return result, written


def write_outputs(result: RunResult, out_dir: str | Path, fmt: str = "csv", steps_path: Path | None = None,
                  why: str | None = None, steps: str = "rows", timeline_s: float | None = None) -> dict:
    """Write summary.json, requests.<fmt> and steps.<fmt> (``fmt``: csv or parquet) as one set
    (batchsim.sim.io.write_set: never a mix of an old run's files and this one's; manifest.json
    says what the set holds, in which format and why). ``steps_path``: the step records already
    written (:func:`run_to_folder`; ``steps`` says which: rows or a timeline), moved into the set.
    Returns ``{"format", "steps", "why", "files"}``."""
    writers = {"summary.json": lambda p: write_json(p, result.summary),
               f"requests.{fmt}": lambda p: write_table(p, result.records("requests"), fmt)}
    if steps_path is not None:
        writers[f"steps.{fmt}"] = lambda p: os.replace(steps_path, p)
    elif steps != "none" and result.scenario.measure.step_records and result.scenario.measure.records == "full":
        writers[f"steps.{fmt}"] = lambda p: write_table(p, result.records("steps"), fmt)
    prov = result.summary.get("provenance") or {}
    about = {"written_by": f"batchsim {__version__}", "scenario": result.scenario.name,
             "scenario_hash": prov.get("scenario_hash"), "format": fmt,
             "steps": steps if any(n.startswith("steps.") for n in writers) else "none",
             **({"timeline_s": timeline_s} if steps == "timeline" else {}), **({"why": why} if why else {})}
    write_set(out_dir, writers, about)
    return {"format": fmt, "steps": about["steps"], "timeline_s": about.get("timeline_s"), "why": why,
            "files": list(writers)}
