"""Capacity search: the highest arrival rate one configuration sustains under its SLOs.

A configuration's verdict at a rate comes from one simulation (a *point*);
the search only sees ``evaluate(rate) -> metrics`` and the SLO limits, so it
is tested with plain functions. It brackets the capacity by doubling (or
halving) from a start rate, then bisects until the bracket ``[lo, hi)`` is
within a relative tolerance: ``hi - lo <= tol * lo``. The answer is ``lo``,
a rate that was simulated and met every SLO.

NOTE: the rates tried depend only on the start rate and on which earlier
rates passed, and a point's metrics do not depend on the SLO. So a looser SLO
(one that passes every rate a tighter one passes) can only keep a bracket
higher: the capacity found is monotone in the SLO even when the metrics are
noisy in the rate (the proof is in docs/capacity-planning.md).

A point can also be *not evaluable* (too few completed requests in its
measured window to trust a p99, or a null SLO metric) or *refused* (the
configuration rejects requests at any load): neither passes nor fails, and the
search stops there with no capacity (:class:`SearchOutcome` ``status``),
since a bracket continued past it would measure the window, not the SLO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from batchsim.sim.errors import InputError
from batchsim.sim.measure import MIN_REQUESTS, thin_window

__all__ = ["name_values", "SLO_METRICS", "MIN_COMPLETED", "MIN_REQUESTS", "LOAD_DEPENDENT_REJECTIONS", "PASS", "FAIL",
           "NOT_EVALUABLE", "REFUSED", "BOUNDS", "BURST", "parse_slos", "judge", "judge_gates", "verdict", "search", "SearchOutcome",
           "nice_rate", "slo_value"]

_STATS = ("mean", "median", "p90", "p99")
# Summary keys (milliseconds) an SLO may bound; the *_queue_ms ones are computed
# by batchsim.app.capacity.planner from the request records (queue = admitted - arrival).
SLO_METRICS: tuple[str, ...] = tuple(
    f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el", "queue") for s in _STATS
) + ("max_itl_ms", "max_queue_ms")

# A point whose requests all arrive within one E2E is a burst: a short run meets loose SLOs at any
# rate by serving them after they have all arrived (100 requests planned at 1.4 million req/s)
BURST = "a burst, not a sustained rate"
MIN_COMPLETED = 0.99  # a point also fails when fewer of its measured requests complete

# A rejection of these kinds (batchsim.sim.metrics.rejection_kind) is overload: it fails
# the point. Any other kind (a request over max_model_len, the KV capacity or the step
# budget) depends only on the request's lengths, so the configuration rejects it at
# every load: the configuration is refused unless rejections are allowed.
LOAD_DEPENDENT_REJECTIONS = ("queue full",)

PASS, FAIL, NOT_EVALUABLE, REFUSED = "pass", "fail", "not evaluable", "refused"
_RANK = {REFUSED: 0, NOT_EVALUABLE: 1, FAIL: 2}  # which seed's verdict a pooled point reports first

# Which value of a pooled SLO metric (mean ± half-width of its 95% interval over seeds,
# batchsim.reports.stats) a point is judged by: "upper" (the SLO holds at the interval's
# upper end: the plan's decision), "mean", or "lower" (it is not shown to fail). A metric
# without an interval (one seed) is judged by its value under every bound.
BOUNDS = ("upper", "mean", "lower")
_REMEDY = "raise workload.num_requests, or lower measure.warmup_s/cooldown_s"


def name_values(items: Sequence[str] | None, flag: str, form: str) -> list[tuple[str, str]]:
    """A repeatable ``flag``'s ``NAME=VALUE`` items, each of which may list several separated by
    commas, as ``(name, value)`` pairs, stripped (an item without ``=`` or a name is an InputError
    naming ``form``)."""
    out = []
    for item in items or []:
        for part in (p.strip() for p in item.split(",")):
            if not part:
                continue
            name, sep, raw = part.partition("=")
            if not sep or not name.strip():
                raise InputError(f"expected {form}, got {part!r}", flag)
            out.append((name.strip(), raw.strip()))
    return out


def parse_slos(items: Sequence[str] | None) -> dict[str, float]:
    """``["p99_ttft_ms=500", "p99_tpot_ms=50,max_itl_ms=200"]`` -> ``{name: limit}``.

    Unknown names, non-positive limits and a name given twice are InputErrors.
    """
    out: dict[str, float] = {}
    for name, raw in name_values(items, "--slo", "NAME=LIMIT_MS"):
        if name not in SLO_METRICS:
            raise InputError(f"unknown SLO metric {name!r}; valid: {', '.join(SLO_METRICS)}", "--slo")
        try:
            limit = float(raw)
        except ValueError:
            raise InputError(f"{name}: not a number: {raw!r}", "--slo") from None
        if not (limit > 0 and math.isfinite(limit)):
            raise InputError(f"{name}: the limit must be a positive number of ms, got {raw!r}", "--slo")
        if name in out:
            raise InputError(f"{name} is given twice", "--slo")
        out[name] = limit
    if not out:
        raise InputError("give at least one SLO, e.g. --slo p99_ttft_ms=500 --slo p99_tpot_ms=50", "--slo")
    return out


def _kinds_text(kinds: Mapping[str, float]) -> str:
    return ", ".join(f"{int(n)} {k}" for k, n in kinds.items())


def slo_value(metrics: Mapping, name: str, bound: str = "upper") -> tuple[float | None, str]:
    """``(the value an SLO on name is judged by, how to say it)``; None when the metric is null.

    With a ``<name>_ci95`` half-width (a point pooled over seeds), ``bound`` picks the
    interval's upper end, its mean or its lower end."""
    from batchsim.reports.stats import CI_SUFFIX

    value = metrics.get(name)
    if value is None or not math.isfinite(float(value)):
        return None, ""
    value = float(value)
    half = metrics.get(name + CI_SUFFIX)
    if half is None or not math.isfinite(float(half)) or bound == "mean":
        return value, f"{name} {value:.6g}" + (f" (mean of {metrics.get('seeds')} seeds)" if half is not None
                                               and bound == "mean" else "")
    half = float(half)
    end = value + half if bound == "upper" else value - half
    return end, f"{name} {value:.6g} ± {half:.3g}: the 95% interval's {bound} end {end:.6g}"


def judge(metrics: Mapping, slos: Mapping[str, float], min_requests: int = MIN_REQUESTS,
          allow_rejections: bool = False, bound: str = "upper") -> tuple[str, str]:
    """``(PASS | FAIL | NOT_EVALUABLE | REFUSED, why)`` for one point's metrics.

    In order: rejections of a load-independent kind (``all_rejected_by_reason``)
    *refuse* the configuration unless ``allow_rejections`` (then they are
    tolerated: the completion rule below counts only the requests not rejected);
    any other rejection, and any request unfinished at the horizon, fails the
    point; fewer than ``min_requests`` completed in the measured window (when
    the point says how many), or a null SLO metric, makes it *not evaluable*; an
    open loop whose measured requests arrive within less than their median E2E
    (``arrival_span_s``: :data:`BURST`) fails it, as a limit of the run's length;
    fewer than :data:`MIN_COMPLETED` of its measured requests completed fails it;
    then each SLO, by :func:`slo_value` under ``bound``.

    A point pooled over seeds (``per_seed``: one metrics mapping per seed, and
    ``seed_values``) is judged seed by seed for all but the SLOs: the worst
    seed's verdict (refused, then not evaluable, then fail) is the point's,
    since a mean cannot rescue a seed that dropped requests or measured too few
    (the plan worker stops adding seeds at the first such seed).
    """
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    per_seed = metrics.get("per_seed")
    if per_seed:
        seeds = metrics.get("seed_values") or list(range(len(per_seed)))
        worst = None
        for seed, m in zip(seeds, per_seed):
            status, why = judge_gates(m, min_requests, allow_rejections)
            if status != PASS and (worst is None or _RANK[status] < _RANK[worst[0]]):
                worst = (status, f"seed {seed}: {why}" if len(per_seed) > 1 else why)
        if worst is not None:
            return worst
        return _judge_slos(metrics, slos, bound)
    status, why = judge_gates(metrics, min_requests, allow_rejections)
    if status != PASS:
        return status, why
    return _judge_slos(metrics, slos, bound)


def _judge_slos(metrics: Mapping, slos: Mapping[str, float], bound: str) -> tuple[str, str]:
    for name, limit in slos.items():
        value, text = slo_value(metrics, name, bound)
        if value is None:
            return NOT_EVALUABLE, f"{name} is null: no measured request has it"
        if value > limit:
            return FAIL, f"{text} > {limit:g}"
    return PASS, ""


def judge_gates(metrics: Mapping, min_requests: int, allow_rejections: bool) -> tuple[str, str]:
    """Everything but the SLOs: rejections, unfinished requests, a thin window, completion."""
    rejected = int(metrics.get("all_rejected", metrics.get("rejected", 0)) or 0)
    kinds = dict(metrics.get("all_rejected_by_reason") or {})
    fixed = {k: n for k, n in kinds.items() if k not in LOAD_DEPENDENT_REJECTIONS}
    overload = rejected - int(sum(fixed.values()))
    if fixed and not allow_rejections:
        return REFUSED, (f"rejects {int(sum(fixed.values()))} of {int(metrics.get('num_requests', 0) or 0)} "
                         f"requests at any load ({_kinds_text(fixed)}); raise the limit, or plan with "
                         "--allow-rejections")
    if overload:
        load = {k: n for k, n in kinds.items() if k in LOAD_DEPENDENT_REJECTIONS}
        return FAIL, f"{overload} requests rejected" + (f" ({_kinds_text(load)})" if load else "")
    unfinished = int(metrics.get("all_unfinished", metrics.get("unfinished", 0)) or 0)
    if unfinished:
        return FAIL, f"{unfinished} requests unfinished at the horizon"
    if "completed" in metrics:
        done = int(metrics["completed"] or 0)
        if "measured_requests" in metrics and not metrics["measured_requests"]:
            return NOT_EVALUABLE, f"no request arrived in the measured window; {_REMEDY}"
        if done < min_requests:
            return NOT_EVALUABLE, f"{thin_window(done, min_requests)}; {_REMEDY}"
    span, e2el = metrics.get("arrival_span_s"), metrics.get("median_e2el_ms")
    if span is not None and e2el is not None and span * 1000.0 < e2el:
        # NOTE: a short run meets loose SLOs at any rate by serving its requests as one burst after they
        # have all arrived (100 requests planned at 1.4 million req/s); its point says nothing of a rate
        # (a FAIL, so the search bisects below it; plan flags a capacity whose span is short: SHORT)
        return FAIL, (f"its measured requests arrive within {span:.3g} s, less than their median E2E "
                      f"({e2el / 1000.0:.3g} s): {BURST}; raise workload.num_requests (plan: or --max-requests) to look higher")
    measured = int(metrics.get("measured_requests", 0) or 0) - int(metrics.get("rejected", 0) or 0)
    if measured > 0 and metrics.get("completed", 0) < MIN_COMPLETED * measured:
        return FAIL, f"only {int(metrics['completed'])} of {measured} requests completed"
    return PASS, ""


def verdict(metrics: Mapping, slos: Mapping[str, float], min_requests: int = MIN_REQUESTS,
            allow_rejections: bool = False, bound: str = "upper") -> tuple[bool, str]:
    """``(meets every SLO, why not)`` for one point's metrics (:func:`judge`: a point
    that is not evaluable or refused does not meet the SLO).

    A point with any rejected or unfinished request, or with fewer than
    :data:`MIN_COMPLETED` of its measured requests completed, fails whatever
    its latencies (those would describe only the requests that got through).
    """
    status, why = judge(metrics, slos, min_requests, allow_rejections, bound)
    return status == PASS, why


def nice_rate(rate: float) -> float:
    """``rate`` rounded to 3 significant digits (the start of a search)."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"a start rate must be positive and finite, got {rate}")
    return float(f"{rate:.3g}")


@dataclass
class SearchOutcome:
    """Where a search ended.

    ``capacity`` is the highest rate that met every SLO (0.0 when none did),
    ``metrics`` the metrics there; ``limit_rate`` is the lowest failing rate
    above it (the bracket's top; None if every rate tried passed) and
    ``limit_reason`` why it failed. ``trail`` lists ``(rate, passed)`` in the
    order tried. ``status`` is PASS or FAIL (capacity > 0 or not), or
    NOT_EVALUABLE / REFUSED when the search stopped at such a point
    (``limit_rate``): then ``capacity`` is 0.0 and ``metrics`` None.
    """

    capacity: float
    metrics: dict | None
    limit_rate: float | None
    limit_reason: str
    trail: list[tuple[float, bool]] = field(default_factory=list)
    status: str = PASS


class _Stop(Exception):
    """A point that neither passes nor fails: the search ends there."""

    def __init__(self, rate: float, status: str, why: str) -> None:
        super().__init__(why)
        self.rate, self.status, self.why = rate, status, why


def search(evaluate: Callable[[float], Mapping[str, float]], slos: Mapping[str, float], start: float,
           tol: float = 0.05, max_doublings: int = 16, max_halvings: int = 5,
           min_requests: int = MIN_REQUESTS, allow_rejections: bool = False,
           bound: str = "upper", integer: bool = False, unit: str = "req/s",
           cap: float | None = None) -> SearchOutcome:
    """Bracket then bisect the highest rate whose point meets ``slos`` (judged under ``bound``).

    Doubles from ``start`` while points pass (at most ``max_doublings``
    times) or halves while they fail (at most ``max_halvings`` times; then
    the capacity is 0), then bisects ``[lo, hi)`` until ``hi - lo <= tol * lo``.
    ``integer`` searches whole numbers from 1 (a closed loop's clients, ``unit``
    "clients"): halving stops at 1 and bisection when ``hi - lo <= 1`` as well. ``cap``: the
    highest value a point may have (doubling stops there; if it passes, it is the capacity).

    NOTE: the halving floor is low on purpose but finite: a point far below
    capacity serves requests nearly one at a time, which costs the most
    simulated steps and cannot rescue an SLO a lone request already misses.
    """
    if not 0 < tol < 1:
        raise InputError(f"the tolerance must be in (0, 1), got {tol:g}", "--tol")
    trail: list[tuple[float, bool]] = []
    seen: dict[float, tuple[bool, str, dict]] = {}

    def probe(rate: float) -> bool:
        if rate not in seen:
            m = dict(evaluate(rate))
            status, why = judge(m, slos, min_requests, allow_rejections, bound)
            if status in (NOT_EVALUABLE, REFUSED):
                trail.append((rate, False))
                raise _Stop(rate, status, why)
            seen[rate] = (status == PASS, why, m)
        trail.append((rate, seen[rate][0]))
        return seen[rate][0]

    try:
        first = max(1, int(round(start))) if integer else nice_rate(start)
        if cap is not None:
            first = min(first, cap)
        lo, hi = _bracket(probe, first, max_doublings, max_halvings, integer, cap)
        if lo is None:
            what = "1 client" if integer and hi == 1 else f"{hi:.4g} {unit}"
            return SearchOutcome(0.0, None, hi, f"fails even at {what}: {seen[hi][1]}", trail, FAIL)
        while hi is not None and hi - lo > tol * lo and not (integer and hi - lo <= 1):
            mid = (lo + hi) // 2 if integer else (lo + hi) / 2.0
            if probe(mid):
                lo = mid
            else:
                hi = mid
    except _Stop as stop:
        passed = [r for r, (ok, _, _) in seen.items() if ok]
        why = stop.why if stop.status == REFUSED else f"{stop.status} at {stop.rate:.4g} {unit}: {stop.why}"
        if stop.status == NOT_EVALUABLE and passed:
            why += f" (every SLO was met at {max(passed):.4g} {unit}, but the search cannot go past this point)"
        return SearchOutcome(0.0, None, stop.rate, why, trail, stop.status)
    why = seen[hi][1] if hi is not None else ""
    if hi is None and cap is not None and lo == cap:
        why = f"every SLO met up to {cap:g} {unit}, the most this search may try"
    return SearchOutcome(lo, seen[lo][2], hi, why, trail, PASS)


def _bracket(probe: Callable[[float], bool], start: float, max_doublings: int,
             max_halvings: int, integer: bool = False,
             cap: float | None = None) -> tuple[float | None, float | None]:
    """``(lo, hi)``: lo passed (None if nothing did), hi failed (None if nothing did)."""
    if probe(start):
        lo = start
        for _ in range(max_doublings):
            nxt = lo * 2 if cap is None else min(lo * 2, cap)
            if nxt == lo:
                break
            if not probe(nxt):
                return lo, nxt
            lo = nxt
        return lo, None
    hi = start
    for _ in range(max_halvings if not integer else 64):
        half = hi // 2 if integer else hi / 2.0
        if integer and half < 1:
            break
        if probe(half):
            return half, hi
        hi = half
    return None, hi
