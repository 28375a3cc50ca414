"""Arrival processes: when requests arrive, as a sorted float64 array (seconds).

Each process is a small function ``(cfg, rng, n, duration) -> times``: draw
until ``n`` requests exist or the process clock passes ``duration`` (whichever
comes first; at least one of them is given). All randomness comes from the
``numpy.random.Generator`` passed in, and every draw is vectorized in chunks,
so a million arrivals cost a few milliseconds.

Time origin: the first request arrives at t = 0 (:func:`_first_at_zero`, the one
statement of it). Renewal processes (poisson, gamma, constant, empirical) send it
and then draw gaps, as ``vllm bench serve`` does; the time-varying ones (onoff,
diurnal) send it and then add their own arrivals on their own clock from 0,
unshifted, so onoff keeps its stationary start and diurnal its phase. A zero rate
yields no requests.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np

from batchsim.sim.errors import InputError

from .config import (MAX_REQUESTS, ArrivalConfig, ConstantArrival, DiurnalArrival, EmpiricalArrival,
                     GammaArrival, OnOffArrival, PoissonArrival)

__all__ = ["generate", "renewal", "poisson", "gamma", "constant", "onoff", "diurnal", "empirical"]

_EMPTY = np.zeros(0, dtype=np.float64)


def _chunk(expected: float) -> int:
    """Draws per chunk: the expected count plus six standard deviations, so one chunk nearly always suffices."""
    return int(min(expected + 6.0 * math.sqrt(expected) + 16.0, 1 << 24))


MAX_PERIODS = 100_000_000
"""Most on/off periods :func:`onoff` simulates."""


def _check_count(expected: float, n: int | None) -> None:
    """Refuse a duration that would generate more than MAX_REQUESTS arrivals
    (they would exhaust memory before the simulation starts)."""
    if n is None and expected > MAX_REQUESTS:
        raise InputError(f"about {expected:.3g} requests arrive within duration_s; expected at most "
                         f"{MAX_REQUESTS} (shorten duration_s, lower the rate or set num_requests)",
                         "workload.duration_s")


def _cut(t: np.ndarray, n: int | None, duration: float | None) -> np.ndarray:
    """The first ``n`` times before ``duration``; times that overflow float64 (rates
    near 1e-308) never happen and are dropped."""
    if len(t) and not np.isfinite(t[-1]):
        t = t[: np.searchsorted(t, np.inf, side="left")]
    if duration is not None:
        t = t[: np.searchsorted(t, duration, side="left")]
    return t[:n] if n is not None else t


def _first_at_zero(later: np.ndarray, n: int | None, duration: float | None) -> np.ndarray:
    """A request at t = 0, then ``later`` (sorted, on the process's own clock from 0): the first
    ``n`` before ``duration``. Every process starts this way (vllm bench serve sends its first
    request at once), so a process's clock is never shifted to put its own first arrival at 0."""
    return _cut(np.concatenate(([0.0], later)), n, duration)


def renewal(draw: Callable[[int], np.ndarray], mean_gap: float, n: int | None, duration: float | None) -> np.ndarray:
    """First request at 0, then gaps from ``draw(k)`` (k i.i.d. gaps), until ``n`` or ``duration``."""
    if n == 0 or (duration is not None and duration <= 0):
        return _EMPTY
    if duration is None:
        assert n is not None
        with np.errstate(over="ignore"):  # overflowing times are dropped by _cut
            return _first_at_zero(np.cumsum(draw(n - 1)), n, None)
    expected = duration / mean_gap + 1.0 if mean_gap > 0 else float(n or 0)
    _check_count(expected, n)
    size = _chunk(min(expected, n) if n is not None else expected)
    parts, last, count = [_EMPTY], 0.0, 1
    while last < duration and (n is None or count < n):
        t = last + np.cumsum(draw(size))
        parts.append(t)
        last, count = float(t[-1]), count + size
    return _first_at_zero(np.concatenate(parts), n, duration)


def poisson(cfg: PoissonArrival, rng: np.random.Generator, n: int | None, duration: float | None) -> np.ndarray:
    """Exponential gaps with mean 1/rate."""
    if cfg.rate == 0:
        return _EMPTY
    return renewal(lambda k: rng.exponential(1.0 / cfg.rate, k), 1.0 / cfg.rate, n, duration)


def gamma(cfg: GammaArrival, rng: np.random.Generator, n: int | None, duration: float | None) -> np.ndarray:
    """Gamma gaps with mean 1/rate and coefficient of variation cv (shape 1/cv^2)."""
    if cfg.rate == 0:
        return _EMPTY
    shape = 1.0 / cfg.cv**2
    scale = (1.0 / cfg.rate) / shape  # NOTE: not 1/(rate*shape): that product underflows to 0 at rate 5e-324
    return renewal(lambda k: rng.gamma(shape, scale, k), 1.0 / cfg.rate, n, duration)


def constant(cfg: ConstantArrival, rng: np.random.Generator, n: int | None, duration: float | None) -> np.ndarray:
    """One request every 1/rate seconds (no randomness)."""
    if cfg.rate == 0:
        return _EMPTY
    if duration is not None:
        _check_count(duration * cfg.rate, n)
    # NOTE: with num_requests set, duration x rate may overflow (1e300 s x 1e308/s): n bounds it.
    count = n if duration is None else math.ceil(min(duration * cfg.rate, float(MAX_REQUESTS))) + 1
    if n is not None:
        count = min(count, n)
    with np.errstate(over="ignore"):
        t = np.arange(count, dtype=np.float64) / cfg.rate
    return _cut(t, n, duration)


def onoff(cfg: OnOffArrival, rng: np.random.Generator, n: int | None, duration: float | None) -> np.ndarray:
    """Two-state MMPP: exponential on/off periods, Poisson arrivals at the state's rate.

    The process starts in the on state with probability mean_on/(mean_on+mean_off)
    (its stationary distribution), so the long-run rate holds from t = 0; the request
    at 0 comes on top (:func:`_first_at_zero`).
    """
    cycle = cfg.mean_on_s + cfg.mean_off_s
    mean_rate = (cfg.rate_on * cfg.mean_on_s + cfg.rate_off * cfg.mean_off_s) / cycle
    if mean_rate == 0 or n == 0 or (duration is not None and duration <= 0):
        return _EMPTY
    want = n if duration is None else duration * mean_rate
    _check_count(want, n)
    if n is not None:
        want = min(want, n)
    periods = 2.4 * want / (mean_rate * cycle)
    if periods > MAX_PERIODS:
        raise InputError(f"{want:.6g} requests at a mean {mean_rate:.3g} requests/s take about {periods:.3g} "
                         f"on/off periods; expected at most {MAX_PERIODS:.0e} (use longer periods or "
                         "higher rates)", "workload.arrival")
    pairs = min(max(8, int(periods / 2) + 8), 1 << 20)
    means = np.array([cfg.mean_on_s, cfg.mean_off_s])
    rates = np.array([cfg.rate_on, cfg.rate_off])
    first = 0 if rng.random() < cfg.mean_on_s / cycle else 1
    parts, clock, count = [], 0.0, 0
    while (n is None or count < n) and (duration is None or clock < duration):
        state = (np.arange(2 * pairs) + first) % 2
        length = rng.exponential(means[state])
        start = clock + np.concatenate(([0.0], np.cumsum(length[:-1])))
        k = rng.poisson(rates[state] * length)
        t = np.repeat(start, k) + rng.random(int(k.sum())) * np.repeat(length, k)
        parts.append(np.sort(t))
        clock, count = float(start[-1] + length[-1]), count + int(k.sum())
        if not math.isfinite(clock):  # later arrivals would overflow float64
            break
    # NOTE: was shifted so its own first arrival was at 0, which undid the stationary start
    # (an off start's silence was cut out: 95 requests in the first 10 s where 28.6 belong).
    return _first_at_zero(np.concatenate(parts), n, duration)


def diurnal(cfg: DiurnalArrival, rng: np.random.Generator, n: int | None, duration: float | None) -> np.ndarray:
    """Poisson with rate(t) = rate * (1 + amplitude * cos(2 pi (t - phase_s) / period_s)), by thinning;
    the request at 0 comes on top (:func:`_first_at_zero`)."""
    if cfg.rate == 0 or n == 0 or (duration is not None and duration <= 0):
        return _EMPTY
    peak = cfg.rate * (1.0 + cfg.amplitude)
    # NOTE: the phase reduced to one period: (t - 1e300) / period overflowed to inf, cos(inf)
    # is NaN, no candidate was ever kept and the loop never ended.
    phase = math.fmod(cfg.phase_s, cfg.period_s)
    want = n if duration is None else duration * cfg.rate
    _check_count(want, n)
    if n is not None:
        want = min(want, n)
    size = _chunk(want * peak / cfg.rate)
    parts, clock, count = [], 0.0, 0
    while (n is None or count < n) and (duration is None or clock < duration):
        cand = clock + np.cumsum(rng.exponential(1.0 / peak, size))
        with np.errstate(invalid="ignore"):  # cos(inf) past float64's end: NaN, never kept, loop ends below
            ratio = (1.0 + cfg.amplitude * np.cos(2 * np.pi * (cand - phase) / cfg.period_s)) / (1.0 + cfg.amplitude)
        keep = cand[rng.random(size) < ratio]
        parts.append(keep)
        clock, count = float(cand[-1]), count + len(keep)
        if not math.isfinite(clock):  # later arrivals would overflow float64
            break
    # NOTE: was shifted so its own first arrival was at 0, which moved the peak off phase_s.
    return _first_at_zero(np.concatenate(parts), n, duration)


def empirical(cfg: EmpiricalArrival, rng: np.random.Generator, n: int | None, duration: float | None,
              base_dir: Path | None = None) -> np.ndarray:
    """Gaps resampled with replacement from a trace, optionally rescaled to ``rate``.

    NOTE: an i.i.d. bootstrap keeps the gap distribution (so its CV) but not the
    correlation between consecutive gaps: a trace's slow bursts become short ones.
    """
    from .traces import load_timed  # local import: traces uses renewal() from here

    if cfg.rate == 0:
        return _EMPTY
    t = load_timed(cfg.trace, base_dir, rng, "workload.arrival.trace")[0]
    gaps = np.diff(t)
    if len(gaps) == 0 or gaps.sum() <= 0:
        raise InputError(
            f"{len(t)} request(s) spanning {float(t[-1] - t[0]) if len(t) else 0.0} s; "
            "expected at least two distinct arrival times to take gaps from",
            f"workload.arrival.trace ({cfg.trace.path})",
        )
    if cfg.rate is not None:
        gaps = gaps * (1.0 / cfg.rate) / gaps.mean()
    return renewal(lambda k: rng.choice(gaps, k), float(gaps.mean()), n, duration)


def closed(cfg, rng: np.random.Generator, n: int | None, duration: float | None) -> np.ndarray:
    """A closed loop's placeholder arrivals: zeros (the run makes the times, batchsim.sim.engine)."""
    return np.zeros(int(n or 0), dtype=np.float64)


def think_times(cfg, rng: np.random.Generator, n: int) -> np.ndarray:
    """A closed loop's think times, one per request (the wait after it ends)."""
    z = float(cfg.think_time_s)
    if cfg.think == "exponential" and z > 0:
        return rng.exponential(z, n)
    return np.full(n, z, dtype=np.float64)


_PROCESSES = {"poisson": poisson, "gamma": gamma, "constant": constant, "onoff": onoff, "diurnal": diurnal,
              "closed": closed}


def generate(cfg: ArrivalConfig, rng: np.random.Generator, n: int | None, duration: float | None,
             base_dir: Path | None = None) -> np.ndarray:
    """Arrival times for ``cfg``: sorted float64 seconds, the first at 0 (or none)."""
    if n is None and duration is None:
        raise ValueError("generate() needs n or duration")
    if cfg.process == "empirical":
        return empirical(cfg, rng, n, duration, base_dir)
    return _PROCESSES[cfg.process](cfg, rng, n, duration)
