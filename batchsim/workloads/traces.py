"""Trace readers: Azure, Mooncake, BurstGPT, vllm bench results, generic CSV/JSONL, lengths.

A reader is a function ``(cfg, path, rng) -> Trace`` that parses one file
format into columns and validates them (see :mod:`batchsim.workloads._io` for the
error messages). :func:`load` then applies the options every trace shares, in
this order: sort (unsorted rows are sorted, with a warning), time window
(``start_s``/``end_s`` in seconds after the file's first request), ``sample``,
``max_requests``, ``speedup``, rebasing so the first kept request is at t = 0
(``keep_time`` keeps the file's own clock instead: numeric times as written,
timestamps counted from the file's first one) and ``min_tokens``. Formats without arrival times (``lengths``,
and ``vllm_bench`` with ``arrivals_from: arrival``) come back with
``time=None``; :func:`workloads.build_workload` gives them arrivals.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from batchsim.sim.errors import InputError
from batchsim.sim.sending import CLOSED, NEITHER, sending

from . import _io
from .arrivals import renewal
from .config import (AzureTrace, BurstGPTTrace, CsvTrace, JsonlTrace, LengthsTrace, MooncakeTrace,
                     TraceConfig, VllmBenchTrace)

__all__ = ["Trace", "TraceNote", "trace_notes", "load", "load_timed", "READERS"]


class TraceNote(UserWarning):
    """Something a trace's reader changed about the file's requests that a run's summary must
    say, naming the file and the line: collected by :func:`trace_notes` where a run builds its
    workload, warned (this category) where nothing collects them."""


_NOTES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("batchsim_trace_notes", default=None)


@contextlib.contextmanager
def trace_notes() -> Iterator[list[str]]:
    """Collect the readers' notes made inside the block (each once) into the list it yields,
    instead of warning them. (Not warnings.catch_warnings: that resets the warnings registry,
    so every other warning raised inside would be shown again at each run.)"""
    notes: list[str] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def _note(message: str) -> None:
    notes = _NOTES.get()
    if notes is None:
        warnings.warn(message, TraceNote, stacklevel=5)
    elif message not in notes:
        notes.append(message)


@dataclass(frozen=True)
class Trace:
    """Parsed requests of one file, with the line (or list index) each came from."""

    path: Path
    lines: np.ndarray
    time: np.ndarray | None  # float64 seconds, any origin; None = the file has no times
    prompt: np.ndarray  # int64 >= 0
    output: np.ndarray  # int64 >= 0
    hashes: np.ndarray | None = None  # object array of lists (Mooncake hash_ids)
    fields: bool = False  # ``lines`` are indices into JSON lists (vllm_bench), not line numbers

    def __len__(self) -> int:
        return len(self.prompt)

    def take(self, idx: np.ndarray) -> "Trace":
        """Rows ``idx`` (boolean mask or integer index) of every column."""
        return Trace(self.path, self.lines[idx], None if self.time is None else self.time[idx],
                     self.prompt[idx], self.output[idx], None if self.hashes is None else self.hashes[idx],
                     self.fields)

    def prefix_hashes(self) -> tuple[tuple[int, ...], ...] | None:
        """``hashes`` as the tuple of tuples :class:`batchsim.sim.types.Workload` holds."""
        if self.hashes is None:
            return None
        if all(type(h) is tuple for h in self.hashes):  # the fast JSONL path already built them
            return tuple(self.hashes.tolist())
        out = []
        for i, h in enumerate(self.hashes):
            if h is None:  # (absent or null, while other rows have them)
                raise _io.fail(self.path, int(self.lines[i]), "hash_ids", "missing value; expected a list of block "
                                                                          "hashes on every row (or on none)")
            if not isinstance(h, (list, tuple)) or not all(type(x) is int for x in h):
                raise _io.fail(self.path, int(self.lines[i]), "hash_ids",
                               f"{_io._short(h)} is not a list of integers; expected a list of block hashes")
            out.append(tuple(h))
        return tuple(out)


def _trace(table: _io.Table, time: np.ndarray | None, prompt: str, output: str, hashes: str | None = None) -> Trace:
    return Trace(table.path, table.lines, time, _io.tokens(table, prompt), _io.tokens(table, output),
                 table.columns.get(hashes) if hashes else None, table.fields)


def read_azure(cfg: AzureTrace, path: Path, rng: np.random.Generator) -> Trace:
    """Azure LLM inference trace: TIMESTAMP like ``2023-11-16 18:17:03.9799600`` (2023)
    or ``2024-05-10 00:00:00.009930+00:00`` (2024)."""
    t = _io.read_csv(path, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
    time = _io.times(t, "TIMESTAMP", "datetime")
    return _trace(t, time, "ContextTokens", "GeneratedTokens")


def read_mooncake(cfg: MooncakeTrace, path: Path, rng: np.random.Generator) -> Trace:
    """Mooncake JSONL: timestamp in ms; hash_ids (optional) name 512-token prefix blocks."""
    t = _io.read_jsonl(path, ["timestamp", "input_length", "output_length"], int_list="hash_ids")
    return _trace(t, _io.times(t, "timestamp", "ms"), "input_length", "output_length", "hash_ids")


def _filter(t: _io.Table, column: str, want: str | list[str]) -> np.ndarray:
    wants = [want] if isinstance(want, str) else list(want)
    values = t.columns[column].astype(str)
    mask = np.isin(values, wants)
    if not mask.any():
        have = ", ".join(map(repr, sorted(set(values.tolist()))[:20]))
        raise _io.fail(t.path, None, column, f"no rows with value {', '.join(map(repr, wants))}; expected one of: {have}")
    return mask


def read_burstgpt(cfg: BurstGPTTrace, path: Path, rng: np.random.Generator) -> Trace:
    """BurstGPT CSV: Timestamp in seconds; filters on Model and Log Type; failed rows dropped."""
    cols = ["Timestamp", "Request tokens", "Response tokens"]
    cols += ["Model"] * (cfg.model is not None) + ["Log Type"] * (cfg.log_type is not None)
    t = _io.read_csv(path, cols)
    tr = _trace(t, _io.times(t, "Timestamp", "s"), "Request tokens", "Response tokens")
    keep = np.ones(len(tr), dtype=bool)
    if cfg.model is not None:
        keep &= _filter(t, "Model", cfg.model)
    if cfg.log_type is not None:
        keep &= _filter(t, "Log Type", cfg.log_type)
    if cfg.failed == "drop":
        keep &= tr.output > 0
    return tr.take(keep)


def read_vllm_bench(cfg: VllmBenchTrace, path: Path, rng: np.random.Generator) -> Trace:
    """``vllm bench serve --save-result --save-detailed`` JSON: input_lens/output_lens per request.

    The file has no per-request arrival times (except forks that save
    ``start_times``). With ``arrivals_from: recorded`` the arrivals are drawn
    the way vLLM drew them: the first at 0, then gamma gaps with shape
    ``burstiness`` and mean ``1/request_rate`` (all at 0 when the rate is
    "inf"). A run with ``max_concurrency`` is refused there (:func:`_capped`),
    as ``batchsim calibrate --from-bench`` reads it: at an infinite rate it was
    a closed loop, at a finite one without ``start_times`` neither loop.
    """
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise _io.fail(path, e.lineno, None, f"not valid JSON ({e.msg}); expected the object vllm bench serve saves") from None
    except RecursionError:
        raise _io.fail(path, None, None, "JSON nested too deeply; expected the object vllm bench serve saves") from None
    except UnicodeDecodeError as e:
        raise _io.fail(path, None, None, f"not UTF-8 text ({e.reason}); expected the JSON vllm bench serve saves") from None
    if not isinstance(data, dict):
        raise _io.fail(path, None, None, "not a JSON object; expected the object vllm bench serve saves")
    field = lambda name, msg: InputError(msg, f"{path}, field '{name}'")  # noqa: E731
    cols: dict[str, np.ndarray] = {}
    for key in ("input_lens", "output_lens", "errors", "start_times"):
        if key not in data:
            if key in ("input_lens", "output_lens"):
                raise field(key, "not found; expected per-request lists (run vllm bench serve with --save-result --save-detailed)")
            continue
        if not isinstance(data[key], list):
            raise field(key, f"{_io._short(data[key])} is not a list; expected one entry per request")
        if cols and len(data[key]) != len(cols["input_lens"]):
            raise field(key, f"has {len(data[key])} entries; expected {len(cols['input_lens'])}, one per request like input_lens")
        cols[key] = np.fromiter(data[key], dtype=object, count=len(data[key]))
    n = len(cols["input_lens"])
    if n == 0:
        raise field("input_lens", "is empty; expected one entry per request")
    t = _io.Table(path, cols, np.arange(n, dtype=np.int64), fields=True)
    time = None
    if cfg.arrivals_from == "recorded":
        _capped(data, "start_times" in cols, field)
        time = _io.times(t, "start_times", "s") if "start_times" in cols else _recorded(data, n, rng, field)
    tr = _trace(t, time, "input_lens", "output_lens")
    if cfg.failed == "keep":
        return tr
    failed = tr.output == 0
    if "errors" in cols:
        failed |= np.array([bool(e) for e in cols["errors"]], dtype=bool)
    return tr.take(~failed)


def _rate(data: dict, field) -> float:
    """The saved ``request_rate`` (a number or "inf")."""
    rate = data.get("request_rate")
    if _io.boolean(rate):  # NOTE: float(true) is 1.0: a 1 req/s replay
        raise field("request_rate", f"{_io.boolean(rate)} is a boolean; expected a number or \"inf\"")
    try:
        rate = float(rate)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer beyond float64
        raise field("request_rate", f"{_io._short(rate)} is not a rate; expected a number or \"inf\" (or set arrivals_from: arrival)") from None
    if not rate > 0:
        raise field("request_rate", f"{_io._short(rate)} is not positive; expected a rate > 0 or \"inf\"")
    return rate


def _capped(data: dict, has_start: bool, field) -> None:
    """Refuse to replay the recorded arrivals of a run that ``max_concurrency`` capped in flight
    where :func:`batchsim.sim.sending.sending` (the rule ``batchsim calibrate --from-bench``
    reads these files by too) says they cannot be: a closed loop (an infinite rate), whose send
    times follow from the server's completions (replayed as one by the user's closed arrival
    process), or neither loop (a finite rate without start_times). With a finite rate and
    start_times the saved send times are replayed. It replayed every request at t = 0 (rate
    "inf") or a gamma draw at the uncapped rate, saying nothing.
    """
    conc = data.get("max_concurrency")
    if conc is None:
        return
    if type(conc) is float and conc.is_integer():
        conc = int(conc)
    if type(conc) is not int or conc <= 0:
        shown = _io.boolean(conc) or _io._short(conc)
        raise field("max_concurrency", f"{shown} is not a client count; expected a positive integer or null")
    rate = _rate(data, field)
    sent = sending(rate, conc, has_start)
    closed = f"workload.arrival: {{process: closed, concurrency: {conc}}} with trace.arrivals_from: arrival"
    if sent == CLOSED:
        raise field("max_concurrency", f"is {conc} at request_rate inf: the run was a closed loop of {conc} clients, "
                                       "whose send times depend on the server's responses, so its arrivals are "
                                       f"not replayed; expected {closed}")
    if sent == NEITHER:
        raise field("max_concurrency", f"is {conc} at request_rate {rate:g} and the file has no start_times: requests "
                                       f"sent at a rate and capped at {conc} in flight are neither an open nor a "
                                       "closed loop, so their arrivals cannot be regenerated; expected a file with "
                                       f"start_times, or trace.arrivals_from: arrival with a workload.arrival "
                                       f"(a closed loop: {{process: closed, concurrency: {conc}}}, or a rate)")


def _recorded(data: dict, n: int, rng: np.random.Generator, field) -> np.ndarray:
    rate = _rate(data, field)
    if _io.boolean(data.get("burstiness")):  # NOTE: float(true) is 1.0: a Poisson replay
        raise field("burstiness", f"{_io.boolean(data['burstiness'])} is a boolean; expected vLLM's gamma shape (1 = Poisson)")
    shown = burst = data.get("burstiness", 1.0)
    if isinstance(burst, int):  # NOTE: a JSON integer may exceed float64 (and numpy's int64)
        burst = float(burst) if abs(burst) < 1e300 else float("inf")
    if not isinstance(burst, (int, float)) or not burst > 0:
        raise field("burstiness", f"{_io._short(shown)} is not a positive number; expected vLLM's gamma shape (1 = Poisson)")
    if not np.isfinite(burst):  # NOTE: an infinite shape drew NaN gaps: fewer times than rows
        raise field("burstiness", f"{_io._short(shown)} is not finite; expected vLLM's gamma shape (1 = Poisson)")
    if np.isinf(rate) or n == 0:
        return np.zeros(n)
    t = renewal(lambda k: rng.gamma(burst, (1.0 / rate) / burst, k), 1.0 / rate, n, None)  # rate*burst may underflow
    if len(t) < n:  # times past float64's range are dropped
        raise field("request_rate", f"{_io._short(rate)} puts arrival times beyond {t[-1]:.3g} s; "
                                    "expected a rate that replays the file in finite time")
    return t


def read_csv(cfg: CsvTrace, path: Path, rng: np.random.Generator) -> Trace:
    """Generic CSV; ``columns`` maps arrival/prompt_tokens/output_tokens to header names."""
    c = cfg.columns
    t = _io.read_csv(path, list(dict.fromkeys([c.arrival, c.prompt_tokens, c.output_tokens])), sep=cfg.sep)
    return _trace(t, _io.times(t, c.arrival, cfg.time_unit), c.prompt_tokens, c.output_tokens)


def read_jsonl(cfg: JsonlTrace, path: Path, rng: np.random.Generator) -> Trace:
    """Generic JSON lines; ``columns`` maps arrival/prompt_tokens/output_tokens to keys."""
    c = cfg.columns
    t = _io.read_jsonl(path, list(dict.fromkeys([c.arrival, c.prompt_tokens, c.output_tokens])))
    return _trace(t, _io.times(t, c.arrival, cfg.time_unit), c.prompt_tokens, c.output_tokens)


def read_lengths(cfg: LengthsTrace, path: Path, rng: np.random.Generator) -> Trace:
    """Prompt/output lengths without times (CSV, or JSONL by suffix)."""
    c = cfg.columns
    t = _io.read_table(path, list(dict.fromkeys([c.prompt_tokens, c.output_tokens])))
    return _trace(t, None, c.prompt_tokens, c.output_tokens)


READERS = {"azure": read_azure, "mooncake": read_mooncake, "burstgpt": read_burstgpt,
           "vllm_bench": read_vllm_bench, "csv": read_csv, "jsonl": read_jsonl, "lengths": read_lengths}


def _sorted(tr: Trace) -> Trace:
    back = np.diff(tr.time) < 0
    if not back.any():
        return tr
    i = int(np.argmax(back)) + 1
    where = f"field 'start_times[{tr.lines[i]}]'" if tr.fields else f"line {tr.lines[i]}"
    _note(f"{tr.path}: rows are not sorted by arrival time ({where} is earlier than the row before it); "
          "replaying them sorted by time")
    return tr.take(np.argsort(tr.time, kind="stable"))


def _window(tr: Trace, cfg: TraceConfig) -> Trace:
    t = tr.time - tr.time[0]
    keep = t >= cfg.start_s
    if cfg.end_s is not None:
        keep &= t < cfg.end_s
    if not keep.any():
        raise InputError(f"no requests in the window start_s={cfg.start_s}, end_s={cfg.end_s}; "
                         f"the trace spans 0 to {t[-1]:.6g} s after its first request", str(tr.path))
    return tr.take(keep)


def _subsample(tr: Trace, cfg: TraceConfig, rng: np.random.Generator, field: str) -> Trace:
    if cfg.sample is not None and cfg.sample < 1:
        k = int(round(cfg.sample * len(tr)))
        if k == 0:  # NOTE: was an empty run that exited 0
            raise InputError(f"{cfg.sample:g} of the {len(tr)} rows rounds to 0 rows; expected a fraction that "
                             f"keeps at least one row (1/{len(tr)} = {1 / len(tr):.3g})", f"{field}.sample ({tr.path})")
        tr = tr.take(np.sort(rng.choice(len(tr), size=k, replace=False)))
    if getattr(cfg, "shuffle", False):
        tr = tr.take(rng.permutation(len(tr)))
    if cfg.max_requests is not None:
        tr = tr.take(slice(0, cfg.max_requests))
    return tr


def load(cfg: TraceConfig, base_dir: Path | None, rng: np.random.Generator, field: str = "workload.trace") -> Trace:
    """Read, validate and apply the shared options; times start at 0 unless ``keep_time``.
    ``field``: where ``cfg`` is in the scenario, for errors about its options."""
    path = _io.resolve(cfg.path, base_dir)
    tr = READERS[cfg.format](cfg, path, rng)
    if len(tr) == 0:
        raise InputError("every request is marked failed; expected at least one successful request "
                         "(or set failed: keep)", str(path))
    if tr.time is not None:
        tr = _window(_sorted(tr), cfg)
    tr = _subsample(tr, cfg, rng, field)
    if tr.time is not None:
        with np.errstate(over="ignore"):
            time = tr.time / cfg.speedup
        if len(time) and not np.isfinite(time[-1]):  # NOTE: an inf arrival ended the run at t = inf
            raise InputError(f"speedup {cfg.speedup:g} puts arrival times beyond float range; expected a "
                             f"speedup that keeps {tr.time[-1]:.6g} s finite", f"{tr.path}: speedup")
        if not cfg.keep_time and len(time):
            time = time - time[0]
        tr = replace(tr, time=time)
    return replace(tr, prompt=np.maximum(tr.prompt, cfg.min_tokens), output=np.maximum(tr.output, cfg.min_tokens))


def load_timed(cfg: TraceConfig, base_dir: Path | None, rng: np.random.Generator,
               field: str = "workload.trace") -> tuple[np.ndarray, Trace]:
    """:func:`load` for a trace that must have times: ``(time, trace)``."""
    tr = load(cfg, base_dir, rng, field)
    if tr.time is None:
        raise InputError(f"format '{cfg.format}' has no arrival times; expected a trace with times", str(tr.path))
    return tr.time, tr
