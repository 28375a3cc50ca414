"""Compose a :class:`batchsim.sim.types.Workload` from a validated :class:`WorkloadConfig`.

The one entry point the runner calls. It splits the generator it is given
into independent streams (arrivals, prompt lengths, output lengths, trace
sampling), so changing one part of a scenario (say the arrival rate) leaves
the other parts' draws unchanged: sweeps over load compare the same requests.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from batchsim.sim.errors import InputError
from batchsim.sim.types import ClosedLoop, Workload

from . import arrivals, lengths, traces
from .config import WorkloadConfig

__all__ = ["build_workload"]


def build_workload(cfg: WorkloadConfig, rng: np.random.Generator, base_dir: Path | None = None) -> Workload:
    """The requests ``cfg`` describes, sorted by arrival, the first at t = 0.

    ``rng`` is the only source of randomness; relative file paths resolve
    against ``base_dir`` (the scenario file's folder; the working directory
    when None). Bad files raise :class:`batchsim.sim.errors.InputError`.
    """
    base = Path(base_dir) if base_dir is not None else None
    # NOTE: spawn(5) keeps the first four streams identical to spawn(4).
    r_arrival, r_prompt, r_output, r_trace, r_prefix = rng.spawn(5)
    return _closed_loop(_build(cfg, base, r_arrival, r_prompt, r_output, r_trace, r_prefix), cfg, r_arrival)


def _closed_loop(wl: Workload, cfg: WorkloadConfig, rng: np.random.Generator) -> Workload:
    """A closed loop's clients and think times (drawn after the placeholder arrivals, which draw nothing)."""
    if cfg.arrival.process != "closed":
        return wl
    think = arrivals.think_times(cfg.arrival, rng, len(wl))
    if float(think.sum()) > MAX_ARRIVAL_S:  # a client's sends could reach times where a step no longer advances the clock
        raise InputError(f"the think times add up to {float(think.sum()):.3g} s; expected at most {MAX_ARRIVAL_S:.3g} s "
                         "in all (lower think_time_s or num_requests)", "workload.arrival.think_time_s")
    return replace(wl, closed=ClosedLoop(int(cfg.arrival.concurrency), think))


def _build(cfg: WorkloadConfig, base: Path | None, r_arrival, r_prompt, r_output, r_trace, r_prefix) -> Workload:
    if cfg.trace is None:
        t = arrivals.generate(cfg.arrival, r_arrival, cfg.num_requests, cfg.duration_s, base)
        _check_span(t, "workload.arrival")
        wl = Workload(
            arrival=t,
            prompt_tokens=lengths.sample(cfg.prompt_tokens, len(t), r_prompt, base),
            output_tokens=lengths.sample(cfg.output_tokens, len(t), r_output, base),
        )
        return _with_shared_prefix(wl, cfg.shared_prefix, r_prefix)
    tr = traces.load(cfg.trace, base, r_trace)
    if tr.time is None:
        tr = _replay_with_arrivals(cfg, tr, r_arrival, base)
    else:
        end = len(tr) if cfg.num_requests is None else min(len(tr), cfg.num_requests)
        if cfg.duration_s is not None:
            end = min(end, int(np.searchsorted(tr.time, cfg.duration_s, side="left")))
        tr = tr.take(slice(0, end))
    _check_span(tr.time, str(tr.path) if cfg.trace_has_arrivals else "workload.arrival")
    block = getattr(cfg.trace, "block_tokens", 0) if tr.hashes is not None else 0
    wl = Workload(
        arrival=np.ascontiguousarray(tr.time, dtype=np.float64),
        prompt_tokens=np.ascontiguousarray(tr.prompt, dtype=np.int64),
        output_tokens=np.ascontiguousarray(tr.output, dtype=np.int64),
        prefix_hashes=tr.prefix_hashes(),
        prefix_block_tokens=block,
    )
    return _with_shared_prefix(wl, cfg.shared_prefix, r_prefix)


MAX_ARRIVAL_S = 1e10
"""Latest arrival time accepted (about 300 years)."""


def _check_span(t: np.ndarray, where: str) -> None:
    """Refuse arrivals so late that a step no longer advances the clock.

    NOTE: at t ~ 1e300 s a float's spacing dwarfs any step, so a request could
    complete "before" it arrived. Up to 1e10 s the spacing stays below 2e-6 s.
    """
    if len(t) and t[-1] > MAX_ARRIVAL_S:
        raise InputError(f"the last request arrives at {t[-1]:.3g} s; expected every arrival within "
                         f"{MAX_ARRIVAL_S:.0e} s (raise the rate or shorten the trace's span)", where)


MAX_PREFIX_UNITS = 1 << 20
"""Most shared-prefix blocks one prompt may have."""


def _with_shared_prefix(wl: Workload, sp, rng: np.random.Generator) -> Workload:
    """Attach prefix hashes: template units shared within a group, the rest unique.

    Template ``g``'s unit ``i`` is keyed ``g * 2**32 + i``; a request's own
    units get keys from ``2**62`` up, unique per request, so they never hit.
    """
    if sp is None:
        return wl
    n = len(wl)
    longest = int(wl.prompt_tokens.max()) if n else 0
    if -(-longest // sp.block_tokens) > MAX_PREFIX_UNITS:
        # NOTE: each prompt's block keys are a Python list; 10^9 of them never finished.
        raise InputError(f"a {longest}-token prompt makes {-(-longest // sp.block_tokens)} blocks of "
                         f"{sp.block_tokens} tokens; expected at most {MAX_PREFIX_UNITS} per prompt "
                         "(raise block_tokens or shorten the prompts)", "workload.shared_prefix.block_tokens")
    member = rng.random(n) < sp.fraction
    group = rng.integers(0, sp.groups, n)
    unit = sp.block_tokens
    hashes = []
    own = 2**62
    for i, p in enumerate(wl.prompt_tokens.tolist()):
        units = -(-p // unit)
        shared = min(sp.tokens, p) // unit if member[i] else 0
        g = int(group[i]) << 32
        keys = [g + k for k in range(shared)] + list(range(own, own + units - shared))
        own += units - shared
        hashes.append(tuple(keys))
    return Workload(arrival=wl.arrival, prompt_tokens=wl.prompt_tokens, output_tokens=wl.output_tokens,
                    prefix_hashes=tuple(hashes), prefix_block_tokens=unit)


def _replay_with_arrivals(cfg: WorkloadConfig, tr: traces.Trace, rng: np.random.Generator,
                          base: Path | None) -> traces.Trace:
    """Lengths from the trace in order, arrivals from ``cfg.arrival``.

    Without num_requests or duration_s, every row is replayed once. NOTE: when
    the arrival process asks for more requests than the file has rows, rows
    repeat from the start (cycling keeps the file's length distribution exactly,
    where resampling would only match it in expectation).
    """
    n, duration = cfg.num_requests, cfg.duration_s
    if n is None and duration is None:
        n = len(tr)
    t = arrivals.generate(cfg.arrival, rng, n, duration, base)
    if len(tr) == 0:
        t = t[:0]
    return replace(tr.take(np.arange(len(t)) % max(len(tr), 1)), time=t)
