"""A disaggregated deployment's run: the pools' parts, the SimPy engine, and the pool-level summary.

:func:`simulate_disagg` is what :func:`batchsim.app.runner.simulate` runs for a scenario with a
``disaggregation`` section: each pool is built as a colocated scenario would build its replicas
(its hardware, tensor parallelism, policy, KV cache), the pools run on
:class:`batchsim.sim.disagg.DisaggCluster`, and the records and summary are made by the colocated
run's own :func:`~batchsim.app.runner.conclude`, with what only a disaggregated run has added:
the transfer columns of each request, the TTFT split, the pools' utilization and the link's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import simpy

from batchsim import policies
from batchsim.app.config import PoolConfig, Scenario, scenario_from_dict
from batchsim.app.runner import (Parts, RunResult, _check_max_model_len, _itl_records, _kv_cache, _policy_contract,
                                 build_cost, conclude, overhead_terms, provenance)
from batchsim.engines import preset_report
from batchsim.policies.step import IterationConfig
from batchsim.sim.aggregate import StepTotals
from batchsim.sim.disagg import TRANSFER_COLUMNS, DisaggCluster, KVLink, LinkSpec, Livelock
from batchsim.sim.engine import Replica
from batchsim.sim.errors import InputError
from batchsim.sim.frontend import engine_arrivals
from batchsim.sim.itl import TokenSteps
from batchsim.sim.metrics import RunTotals, in_window, ms_stats, pool_utilization
from batchsim.sim.records import FrameSteps, StepStream, request_frame
from batchsim.sim.router import make_router
from batchsim.sim.state import COMPLETED, UNFINISHED
from batchsim.sim.table import column

__all__ = ["simulate_disagg", "ENGINE_REASON", "TTFT_PARTS"]

ENGINE_REASON = ("disaggregated serving runs on the SimPy engine: the compiled core has no KV transfer "
                 "(batchsim.sim.disagg)")

# TTFT = frontend_in (when a frontend is priced) + these, per request (seconds)
TTFT_PARTS = ("queue", "prefill", "transfer", "decode_first")


@dataclass
class _Pool:
    name: str
    spec: PoolConfig
    scenario: Scenario  # the pool as a colocated scenario (its hardware, tp, policy)
    parts: Parts
    policies: list
    caches: list
    max_len: int
    first: int  # the global index of its first replica

    @property
    def replicas(self) -> range:
        return range(self.first, self.first + self.spec.replicas)


def _pool_scenario(scenario: Scenario, name: str, spec: PoolConfig) -> Scenario:
    """The pool as a colocated scenario: its replicas, router, hardware, TP and policy, with the
    scenario's engine preset resolved again for them (a key the preset filled is re-resolved for
    the pool's hardware; a pool's own policy takes the preset's values where it sets none)."""
    from batchsim.app.compare import scenario_data

    data = scenario_data(scenario)
    data.pop("disaggregation", None)
    data.update(replicas=spec.replicas, router=spec.router)
    for key in ("hardware", "tensor_parallel_size"):
        if getattr(spec, key) is not None:
            data[key] = getattr(spec, key)
    if spec.policy is not None:
        data["policy"] = dict(spec.policy)
        data.pop("engine_preset_values", None)
    try:
        return scenario_from_dict(data, f"disaggregation.{name}")
    except InputError as e:
        where = e.where
        for field in ("policy", "tensor_parallel_size"):  # (the pool's own fields; its TP: a preset's derived
            if where:                                      # knob whose deployment does not fit)
                where = where.replace(f"disaggregation.{name}: {field}", f"disaggregation.{name}.{field}")
        raise InputError(e.message, where) from None


def _pool(scenario: Scenario, parts: Parts, name: str, spec: PoolConfig, first: int) -> _Pool:
    where = f"disaggregation.{name}"
    sc = _pool_scenario(scenario, name, spec)
    try:
        cost = build_cost(sc)
        pols = [policies.create_policy(sc.policy) for _ in range(spec.replicas)]
        pool_parts = replace(parts, cost=cost, kv_tokens=cost.kv_capacity_tokens)
        _check_max_model_len(pols[0].config, pool_parts)
        caches = [_kv_cache(pool_parts, p.config) for p in pols]
    except InputError as e:
        own = spec.policy is not None and (e.where or "").startswith("policy")
        field = e.where if own or e.where in ("tensor_parallel_size",) else None
        at = f"{where}.{field}" if field else (f"{where}: {e.where}" if e.where else where)
        raise InputError(e.message, at) from None
    cfg = pols[0].config
    if not isinstance(cfg, IterationConfig):
        # (a padded batch counts the blocks of the batch it releases as free for the next one, which a
        # prefill pool's handed-off KV is not until its transfer ends; and every engine that
        # disaggregates schedules iteration by iteration)
        inherited = "" if spec.policy is not None else (
            f" (the {name} pool takes the scenario's policy unless {where}.policy is set; compare and sweep "
            "--policies swap the scenario's policy, so compare deployments with plan --disagg)")
        raise InputError(f"the {name} pool runs {pols[0].name!r}; a pool of a disaggregated deployment needs an "
                         f"iteration-level policy (continuous or chunked_prefill){inherited}", f"{where}.policy.name")
    if name == "decode":
        if cfg.enable_prefix_caching:
            raise InputError("prefix caching on the decode pool is not modelled (its prompts arrive as KV); "
                             "set it on the prefill pool", f"{where}.policy.enable_prefix_caching")
    max_len = min(parts.max_model_len, pols[0].config.max_model_len or parts.max_model_len)
    return _Pool(name, spec, sc, pool_parts, pols, caches, max_len, first)


def simulate_disagg(scenario: Scenario, parts: Parts, replica: Callable[..., Replica] = Replica,
                    step_sink: Any = "memory") -> RunResult:
    """Run a disaggregated scenario (``scenario.disaggregation``) over prebuilt parts; the
    arguments are :func:`batchsim.app.runner.simulate`'s."""
    d = scenario.disaggregation
    if scenario.engine == "core":
        raise InputError(f"core cannot run this scenario: {ENGINE_REASON}", "engine")
    pre = _pool(scenario, parts, "prefill", d.prefill, 0)
    dec = _pool(scenario, parts, "decode", d.decode, d.prefill.replicas)
    n = d.prefill.replicas + d.decode.replicas
    if isinstance(step_sink, str):
        step_sink = None if scenario.measure.records == "aggregate" else FrameSteps()
    step_totals = StepTotals(n)
    steps = StepStream(step_totals, step_sink)
    client_arrival = parts.workload.arrival
    fe = getattr(pre.parts.cost, "frontend", None)  # (the request's way in is the prefill pool's frontend)
    workload = parts.workload
    if fe is not None and workload.closed is None:
        workload = replace(workload, arrival=engine_arrivals(workload.arrival, workload.prompt_tokens, fe[0], fe[1],
                                                             servers=d.prefill.replicas))
    env = simpy.Environment()
    made = {p.name: [replica(env, p.first + i, pol, p.parts.cost, kv, p.max_len, steps, TokenSteps())
                     for i, (pol, kv) in enumerate(zip(p.policies, p.caches))] for p in (pre, dec)}
    link_cfg = d.link
    spec = LinkSpec(bandwidth=link_cfg.bandwidth_gbps * 1e9 / 8, latency_s=link_cfg.latency_us * 1e-6,
                    mode=link_cfg.transfer, layers=int(pre.parts.cost.model.num_hidden_layers))
    link = KVLink(spec, [pre.scenario.tensor_parallel_size] * d.prefill.replicas,
                  [dec.scenario.tensor_parallel_size] * d.decode.replicas)
    rng = np.random.SeedSequence(scenario.seed).spawn(3)
    routes = []
    for p, seq in ((d.prefill, rng[1]), (d.decode, rng[2])):
        try:
            routes.append(make_router(p.router, np.random.default_rng(seq)))
        except InputError as e:
            raise InputError(e.message, f"disaggregation.{'prefill' if p is d.prefill else 'decode'}.router") from None
    cluster = DisaggCluster(env, made["prefill"], routes[0], made["decode"], routes[1], link,
                            workload, pre.parts.cost.kv_bytes_per_token, d.first_token, scenario.max_queue_len,
                            d.pairing, d.reserved_decode_tokens if d.pairing == "at_arrival" else 0)
    livelock = None
    with _policy_contract(scenario, pre.policies[0]), _policy_contract(scenario, dec.policies[0]):
        try:
            env.run(until=scenario.horizon_s)
        except Livelock as e:  # (the run stops there: what it served is kept, the rest is unfinished)
            livelock = e
    held = cluster.held()
    lost = [s.rid for s in cluster.requests if s.status == UNFINISHED and s.rid not in held]
    if lost:
        raise RuntimeError(f"conservation broken: {len(lost)} unfinished request(s) held by no replica or "
                           f"transfer (rids {lost[:5]})")
    requests = request_frame(cluster.requests)
    if len(requests):
        cols = cluster.transfer_columns(requests)
        requests["admitted"] = cols["prefill_admitted"]  # (admitted: when its prefill began)
        for c in TRANSFER_COLUMNS:
            if c != "prefill_admitted":
                requests[c] = cols[c]
    else:
        requests = requests.assign(**{c: np.empty(0, dtype=np.int64 if c == "prefill_replica" else np.float64)
                                      for c in TRANSFER_COLUMNS if c != "prefill_admitted"})
    every = made["prefill"] + made["decode"]
    itl = _itl_records(every, cluster.requests, len(workload))
    caches = pre.caches + dec.caches
    pool_parts = replace(parts, workload=workload)

    def totals_of(sim_end: float) -> RunTotals:
        # (the whole deployment: peaks are the mean replica's, so peak x replicas is the deployment's)
        return RunTotals(
            replicas=n, sim_end=sim_end,
            peak_flops=sum(p.parts.cost.peak_flops * p.spec.replicas for p in (pre, dec)) / n,
            peak_bandwidth=sum(p.parts.cost.peak_bandwidth * p.spec.replicas for p in (pre, dec)) / n,
            kv_total_blocks=sum(c.total_blocks for c in caches), kv_peak_blocks=sum(c.peak_used for c in caches),
            warmup_s=scenario.measure.warmup_s, cooldown_s=scenario.measure.cooldown_s,
            warmup_requests=scenario.measure.warmup_requests, cooldown_requests=scenario.measure.cooldown_requests)

    sent = cluster.arrival
    requests, step_df, itl, summary, sim_end = conclude(
        scenario, pool_parts, requests, itl, env.now, sent,
        cluster.sent if workload.closed is not None else None, client_arrival, steps, step_sink, step_totals,
        totals_of, f"{pre.policies[0].name}/{dec.policies[0].name}")
    summary["peak_kv_usage"] = max(c.peak_used / c.total_blocks for c in caches)
    if pre.caches[0].prefix_caching:  # (the prefill pool's cache: the decode pool has none)
        hits, looks = sum(c.hits for c in pre.caches), sum(c.lookups for c in pre.caches)
        summary["prefix_cache_hit_rate"] = hits / looks if looks else 0.0
    stalled = cluster.stalled()
    if stalled:
        first = made["decode"][0].index
        stuck = sum(r.queued + len(r.running) for r in made["decode"] if r.index in stalled)
        # (with at_arrival, requests paired with a stalled replica that never got its blocks)
        unpaired = sum(len(cluster.alloc[i - first]) for i in stalled) if d.pairing == "at_arrival" else 0
        how = (f"{livelock}, and the run stopped at {env.now:.6g} s" if livelock is not None else
               "idle with requests it cannot schedule, and nothing left to free their blocks")
        why = ("Their KV is held by transferred requests queued behind a preempted one that cannot get its "
               "blocks back (a first-come-first-served queue, as vLLM's, stops at its head)")
        if unpaired and not stuck:
            how = f"{unpaired} request(s) paired with them wait for blocks that will never be freed"
            why = (f"The first needs its prompt's KV and reserved_decode_tokens ({d.reserved_decode_tokens}) more "
                   "than the replica holds (pairing at_arrival pre-allocates first come first served)")
        summary.setdefault("warnings", []).append(
            f"decode replica(s) {', '.join(map(str, stalled))} stalled with {stuck + unpaired} request(s): {how}. "
            f"{why}; give the decode pool more KV (gpu_memory_utilization, tensor_parallel_size, a larger GPU)")
    summary["disaggregation"] = _report(scenario, requests, step_totals, link, pre, dec, sim_end)
    summary["engine"] = "python"
    summary["engine_reason"] = ENGINE_REASON
    if scenario.overheads.updates() or fe is not None:  # (the frontend a request meets: the prefill pool's;
        summary["overheads"] = overhead_terms(pre.parts.cost)  # each pool's own terms: disaggregation.pools)
    preset = _preset_report(pre, dec)
    if preset is not None:
        summary["engine_preset"] = preset
    kv0 = dec.caches[0]
    hardware = [getattr(p.parts.cost.hardware, "name", p.scenario.hardware) for p in (pre, dec)]
    meta = dict(parts.meta, policy=summary["policy"], kv_blocks=kv0.total_blocks, block_size=kv0.block_size,
                kv_capacity_tokens=kv0.total_blocks * kv0.block_size, replicas=n,
                hardware=hardware[0] if hardware[0] == hardware[1] else f"{hardware[0]} (prefill) + {hardware[1]} (decode)")
    prov = provenance(scenario, parts, dec.policies[0], meta, dec.max_len, "python")
    prov["policy"] = {"prefill": pre.policies[0].config.model_dump(mode="json"),
                      "decode": dec.policies[0].config.model_dump(mode="json")}
    # (the reserve only with at_arrival: provenance reads as scenario input, which refuses it otherwise)
    prov["disaggregation"] = d.model_dump(mode="json", exclude=None if d.pairing == "at_arrival"
                                          else {"reserved_decode_tokens"})
    summary["provenance"] = prov
    engine = {"steps": len(steps), "engine": "python"}
    return RunResult(scenario, summary, requests, step_df, itl, meta, engine)


_PRESET_FROM = ("preset", "scenario", "scenario and preset")


def _preset_report(pre: _Pool, dec: _Pool) -> dict | None:
    """The engine preset's report (:func:`batchsim.engines.preset_report`) of each pool as it ran: the
    pools resolve the preset for their own hardware, TP and policy. ``knobs`` has one entry per knob,
    the pools' own when they agree, else with its ``value`` per pool (``{prefill: .., decode: ..}``), so
    the run's preset line reads as a colocated run's; ``pools`` has each pool's knobs whole."""
    reports = {p.name: preset_report(p.scenario) for p in (pre, dec)}
    if any(r is None for r in reports.values()):
        return None
    first, second = reports["prefill"]["knobs"], reports["decode"]["knobs"]
    knobs = {}
    for key in dict.fromkeys([*first, *second]):
        a, b = first.get(key), second.get(key)
        if a == b:
            knobs[key] = a
            continue
        entries = {"prefill": a, "decode": b}
        froms = {n: str((e or {}).get("from", "left out")) for n, e in entries.items()}
        if len(set(froms.values())) == 1:
            how = froms["prefill"]
        elif all(f in _PRESET_FROM for f in froms.values()):
            how = "scenario and preset"
        else:  # (one pool left it out: its policy has no such knob)
            how = "left out " + "; ".join(f"in the {n} pool: {f.removeprefix('left out: ')}"
                                          for n, f in froms.items() if f not in _PRESET_FROM)
        knobs[key] = {"value": {n: (e or {}).get("value") for n, e in entries.items()}, "from": how,
                      "source": (a or b or {}).get("source", "")}
    return {**reports["prefill"], "knobs": knobs,
            "pools": {n: r["knobs"] for n, r in reports.items()}}


def ttft_parts(requests, prealloc: bool = False) -> dict[str, np.ndarray]:
    """Each request's TTFT split (seconds): ``queue`` (arrival at the engine to its prefill's
    admission), ``prefill`` (to the prompt's last step's end), ``transfer`` (to the KV's arrival at
    the decode replica: waiting for decode blocks and the link, and the transfer's part not
    overlapped with the prefill), ``decode_first`` (to the first token: the decode replica's first
    step with ``first_token: decode``; with ``prefill`` the decode replica's frontend streaming the
    token, 0 without a frontend). With a frontend, ``frontend_in`` comes
    first. With ``prealloc`` (pairing at_arrival) ``decode_blocks`` (arrival at the engine to the
    decode replica's pre-allocation) comes before ``queue``, which then starts there. The parts add
    up to ``ttft``."""
    arrival = column(requests, "arrival", np.float64)
    fin = column(requests, "frontend_in_s", np.float64) if "frontend_in_s" in requests else np.zeros(len(arrival))
    adm, pend = column(requests, "admitted", np.float64), column(requests, "prefill_end", np.float64)
    xend, first = column(requests, "transfer_end", np.float64), column(requests, "first_token", np.float64)
    head = {"frontend_in": fin}
    ready = arrival + fin
    if prealloc:
        blocks = column(requests, "decode_blocks", np.float64)
        head["decode_blocks"], ready = blocks - ready, blocks
    return {**head, "queue": adm - ready, "prefill": pend - adm, "transfer": xend - pend, "decode_first": first - xend}


def _ms_stats(v: np.ndarray) -> dict[str, float | None]:
    """The summary's latency statistics (batchsim.sim.metrics.ms_stats) but the spread."""
    return {f"{k}_ms": x for k, x in ms_stats(v).items() if k != "std"}


def _report(scenario: Scenario, requests, steps: StepTotals, link: KVLink, pre: _Pool, dec: _Pool,
            end: float) -> dict:
    """The deployment's own figures: GPUs, the TTFT split, each pool's utilization, the link's."""
    m = scenario.measure
    win = (requests[in_window(column(requests, "arrival"), m.warmup_s, m.cooldown_s, m.warmup_requests,
                              m.cooldown_requests)] if len(requests) else requests)
    done = win[column(win, "status") == COMPLETED]
    prealloc = scenario.disaggregation.pairing == "at_arrival"
    split = (ttft_parts(done, prealloc) if len(done) else
             {k: np.empty(0) for k in ("frontend_in", *(("decode_blocks",) if prealloc else ()), *TTFT_PARTS)})
    pools = {}
    for p in (pre, dec):
        u = pool_utilization(steps, p.replicas, end, p.parts.cost.peak_flops, p.parts.cost.peak_bandwidth)
        u["peak_kv_usage"] = max(c.peak_used / c.total_blocks for c in p.caches)
        u["overheads"] = overhead_terms(p.parts.cost)  # (each pool's host terms, at its hardware and TP)
        pools[p.name] = {"replicas": p.spec.replicas, "hardware": getattr(p.parts.cost.hardware, "name", p.scenario.hardware),
                         "tensor_parallel_size": p.scenario.tensor_parallel_size, "gpus": p.spec.replicas * p.scenario.tensor_parallel_size,
                         "policy": p.policies[0].name, "kv_blocks_per_replica": p.caches[0].total_blocks, **u}
    wall = max(end, 1e-12)
    busy_out = [b / wall for b in link.out_busy]
    busy_in = [b / wall for b in link.in_busy]
    xfer = (column(done, "transfer_end", np.float64) - column(done, "transfer_start", np.float64)
            if len(done) else np.empty(0))
    return {
        "gpus": pools["prefill"]["gpus"] + pools["decode"]["gpus"],
        "first_token": scenario.disaggregation.first_token,
        "pairing": scenario.disaggregation.pairing,
        **({"reserved_decode_tokens": scenario.disaggregation.reserved_decode_tokens} if prealloc else {}),
        "ttft_split": {k: _ms_stats(v) for k, v in split.items() if k != "frontend_in" or "frontend_in_s" in done},
        "pools": pools,
        "link": {"bandwidth_gbps_per_gpu": scenario.disaggregation.link.bandwidth_gbps,
                 "latency_us": scenario.disaggregation.link.latency_us, "transfer": link.spec.mode,
                 "transfers": link.transfers, "bytes": link.bytes,
                 "transfer_time": _ms_stats(xfer),
                 "utilization_prefill_egress": {"mean": float(np.mean(busy_out)), "max": float(np.max(busy_out))},
                 "utilization_decode_ingress": {"mean": float(np.mean(busy_in)), "max": float(np.max(busy_in))}},
    }

