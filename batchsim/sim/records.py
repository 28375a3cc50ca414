"""Flat records out of a run: one row per request, one per step (gaps: batchsim.sim.itl).

Records are the only thing ``batchsim/reports/`` and ``batchsim.sim.metrics`` read. Steps go
into preallocated numpy columns that double when full, so a long run appends without
allocating a Python object per row.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from batchsim.sim.state import COMPLETED, Seq
from batchsim.sim.table import Table, column

__all__ = ["Columns", "StepStream", "FrameSteps", "TimelineSteps", "AutoSteps", "TIMELINE_FIELDS", "STEP_FIELDS", "empty_steps", "empty_step_table", "empty_requests", "request_frame", "add_latencies"]

# (name, dtype) of every per-step column, in steps.csv order.
STEP_FIELDS: tuple[tuple[str, str], ...] = (
    ("replica", "i4"),
    ("start", "f8"),
    ("end", "f8"),
    ("num_seqs", "i4"),          # useful rows (sequences doing real work)
    ("num_rows", "i4"),          # billed rows, padding and dead slots included
    ("prefill_tokens", "i8"),
    ("decode_tokens", "i8"),
    ("padding_tokens", "i8"),
    ("flops", "f8"),
    ("useful_flops", "f8"),
    ("bytes", "f8"),
    ("compute_s", "f8"),
    ("memory_s", "f8"),
    ("network_s", "f8"),
    ("overhead_s", "f8"),
    ("out_of_range", "i4"),
    ("kv_used_blocks", "i8"),
    ("waiting", "i4"),
    ("running", "i4"),
    ("preempted", "i4"),
)


def places(n: int, k: int, skips) -> np.ndarray:
    """Where k waiting rows go: from row n on, past the ``(i, m)`` skips
    (m rows already written after the first i waiting ones)."""
    shift = np.zeros(k + 1, dtype=np.intp)
    i, m = zip(*skips)
    np.add.at(shift, np.minimum(i, k), m)
    return np.arange(n, n + k) + np.cumsum(shift[:k])


def write_waiting(arrays: list, n: int, columns: list, skips: list) -> None:
    """Write waiting values (``columns``: one sequence per array, all of one
    length k) to rows n.. of ``arrays``, past the ``skips`` (see :func:`places`),
    each value converted as ``array[i] = value`` converts it."""
    if skips:
        at = places(n, len(columns[0]), skips)
        for a, v in zip(arrays, columns):
            a[at] = np.array(v, dtype=a.dtype)
    else:
        s = slice(n, n + len(columns[0]))
        for a, v in zip(arrays, columns):
            a[s] = v


class Columns:
    """Growable typed columns: ``append(*values)`` in field order.

    Appended rows wait in a list and are written to the columns in blocks,
    each value converted exactly as ``column[i] = value`` would convert it.
    Rows written by ``extend`` meanwhile go straight to their place after the
    waiting rows, whose places are kept for them (``_skips``), so the columns
    end up as if every row had been written as it came.
    """

    _BLOCK = 1024  # appended rows written at a time

    def __init__(self, fields: Iterable[tuple[str, str]], capacity: int = 1024) -> None:
        self.fields = tuple(fields)
        self._arrays = [np.empty(capacity, dtype=dt) for _, dt in self.fields]
        self._n = 0  # rows before the first waiting one (all in the arrays)
        self._rows: list[tuple] = []  # appended rows not yet in the arrays
        self._skips: list[tuple[int, int]] = []  # (i, k): k rows extended after the i-th waiting one
        self._skipped = 0  # rows in _skips

    def __len__(self) -> int:
        return self._n + len(self._rows) + self._skipped

    def append(self, *values) -> None:
        rows = self._rows
        rows.append(values)
        if len(rows) >= self._BLOCK:
            self._settle()

    def extend(self, *columns, count: int | None = None) -> None:
        """Append many rows at once, one sequence per field (or, with
        ``count``, a scalar repeated ``count`` times)."""
        k = len(columns[0]) if count is None else count
        waiting = len(self._rows)
        n = self._n + waiting + self._skipped
        if n + k > len(self._arrays[0]):
            self._grow(n + k)
        s = slice(n, n + k)
        for a, v in zip(self._arrays, columns):
            a[s] = v
        if waiting:
            self._skips.append((waiting, k))
            self._skipped += k
        else:
            self._n = n + k

    def reserve(self, k: int) -> tuple[int, list[np.ndarray]] | None:
        """Where the next ``k`` rows go, for a writer that fills the arrays in place (then
        :meth:`commit`): their first row and the arrays (grown to hold them); None while appended
        rows wait (they come first, in places not yet written)."""
        if self._rows:
            return None
        n = self._n
        if n + k > len(self._arrays[0]):
            self._grow(n + k)
        return n, self._arrays

    def commit(self, k: int) -> list[np.ndarray]:
        """The ``k`` rows :meth:`reserve` gave were written: they are rows now (views of them)."""
        n = self._n
        self._n = n + k
        return [a[n:n + k] for a in self._arrays]

    def drop_front(self, k: int) -> None:
        """Forget the first ``k`` rows: the rest move to the front of the same arrays (which
        are reused, so a view of them handed out earlier sees its values change)."""
        self._settle()
        m = self._n - k
        if m:
            for a in self._arrays:
                a[:m] = a[k:k + m]  # (numpy copies overlapping ranges as if through a buffer)
        self._n = m

    def column(self, name: str) -> np.ndarray:
        self._settle()
        for (f, _), a in zip(self.fields, self._arrays):
            if f == name:
                return a[: self._n]
        raise KeyError(name)

    def frame(self):
        """The columns as a pandas frame."""
        self._settle()
        return Table({f: a[: self._n] for (f, _), a in zip(self.fields, self._arrays)}).to_pandas()

    def _grow(self, size: int) -> None:
        size = max(2 * len(self._arrays[0]), size)
        self._arrays = [np.resize(a, size) for a in self._arrays]

    def _settle(self) -> None:
        """Write the waiting rows to their places."""
        rows = self._rows
        k = len(rows)
        if not k:
            return
        n = self._n
        end = n + k + self._skipped
        if end > len(self._arrays[0]):
            self._grow(end)
        self._rows = []
        write_waiting(self._arrays, n, list(zip(*rows)), self._skips)
        self._skips = []
        self._skipped = 0
        self._n = end


def _in_order(end: np.ndarray, rep: np.ndarray) -> bool:
    """Are these rows in the canonical order, by end time then replica?"""
    if len(end) < 2:
        return True
    if (end[1:] > end[:-1]).all():  # (each row ends later than the last: the replicas do not matter)
        return True
    de, dr = np.diff(end), np.diff(rep.astype(np.int64))
    return bool(((de > 0) | ((de == 0) & (dr >= 0))).all())


def empty_step_table() -> Table:
    """Step records with no rows (every column of STEP_FIELDS, its dtype)."""
    return Table({f: np.empty(0, dtype=dt) for f, dt in STEP_FIELDS})


def empty_steps():
    """:func:`empty_step_table` as a pandas frame."""
    return empty_step_table().to_pandas()


class FrameSteps:
    """A :class:`StepStream` sink that keeps the steps in memory: :meth:`frame` at the end."""

    def __init__(self) -> None:
        self._chunks: list[dict[str, np.ndarray]] = []

    def write(self, chunk: dict[str, np.ndarray]) -> None:
        self._chunks.append(chunk)

    def close(self) -> None:
        pass

    def table(self) -> Table:
        if not self._chunks:
            return empty_step_table()
        return Table({f: np.concatenate([c[f] for c in self._chunks]) for f, _ in STEP_FIELDS})

    def frame(self):
        """:meth:`table` as a pandas frame."""
        return self.table().to_pandas()


# (name, dtype, how) of every timeline column after replica and t: how a bin's steps combine
TIMELINE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("steps", "i8", "count"), ("busy_s", "f8", "busy"),
    ("num_seqs", "i8", "sum"), ("num_rows", "i8", "sum"), ("prefill_tokens", "i8", "sum"),
    ("decode_tokens", "i8", "sum"), ("padding_tokens", "i8", "sum"), ("flops", "f8", "sum"),
    ("useful_flops", "f8", "sum"), ("bytes", "f8", "sum"), ("compute_s", "f8", "sum"), ("memory_s", "f8", "sum"),
    ("network_s", "f8", "sum"), ("overhead_s", "f8", "sum"), ("out_of_range", "i8", "sum"),
    ("kv_used_blocks", "i8", "max"), ("waiting", "i8", "max"), ("running", "i8", "max"), ("preempted", "i8", "sum"),
)


def _bins(end: np.ndarray, bin_s: float) -> np.ndarray:
    """The timeline bin each step ends in: ``floor(end / bin_s)``, as integers."""
    x = end / bin_s
    return np.floor(x, out=x).astype(np.int64)


class TimelineSteps:
    """A :class:`StepStream` sink that writes a timeline instead of a row per step: one row per
    replica per ``bin_s`` seconds in which it ended a step (``t``, the bin's start), each step
    counted in the bin where it ends, as a counter read at the bin's edge would count it:
    ``steps``, ``busy_s`` (their durations), sums of the step columns, and the largest
    ``kv_used_blocks``, ``waiting`` and ``running`` seen. ``num_seqs / steps`` is the bin's
    mean batch size. Rows go to ``inner`` (``write(chunk)``, ``close(columns)``) in (t, replica)
    order; memory holds one chunk."""

    keeps_chunks = False  # (write copies what it holds on to: a chunk's arrays may be reused after it)

    def __init__(self, inner, bin_s: float) -> None:
        if not (bin_s > 0 and math.isfinite(bin_s)):
            raise ValueError(f"bin_s must be a positive number of seconds, got {bin_s!r}")
        self.inner, self.bin_s = inner, float(bin_s)
        self._held: dict[str, np.ndarray] | None = None

    @staticmethod
    def columns() -> Table:
        """The timeline's columns, empty."""
        cols = {"replica": np.empty(0, dtype="i4"), "t": np.empty(0)}
        return Table({**cols, **{f: np.empty(0, dtype=dt) for f, dt, _ in TIMELINE_FIELDS}})

    def write(self, chunk: dict[str, np.ndarray]) -> None:
        if not len(chunk["end"]):
            return
        b = _bins(chunk["end"], self.bin_s)  # (rows come by end time: b never falls)
        held = self._held
        if held is not None:  # (the bin the last chunk ended in may go on in this one)
            hb = int(_bins(held["end"][:1], self.bin_s)[0])
            k = int(np.searchsorted(b, hb, "right"))
            joined = {f: np.concatenate((held[f], chunk[f][:k])) for f in chunk}
            self._held = None
            if k == len(b):
                self._held = joined
                return
            self._emit(joined, np.full(len(joined["end"]), hb, dtype=np.int64))
            chunk, b = {f: a[k:] for f, a in chunk.items()}, b[k:]
        split = int(np.searchsorted(b, b[-1], "left"))  # (the last bin waits for the next chunk)
        self._held = {f: a[split:].copy() for f, a in chunk.items()}
        if split:
            self._emit({f: a[:split] for f, a in chunk.items()}, b[:split])

    def _emit(self, rows: dict[str, np.ndarray], b: np.ndarray) -> None:
        r = rows["replica"]
        if len(r) and (r == r[0]).all():  # (one replica's rows: already by bin)
            order = slice(None)
            at = np.flatnonzero(np.concatenate(([True], b[1:] != b[:-1])))
            replica = np.full(len(at), r[0], dtype=np.int32)
        else:
            rep = r.astype(np.int64)
            order = np.lexsort((rep, b))
            b, rep = b[order], rep[order]
            new = np.ones(len(b), dtype=bool)
            new[1:] = (b[1:] != b[:-1]) | (rep[1:] != rep[:-1])
            at = np.flatnonzero(new)
            replica = rep[at].astype(np.int32)
        out = {"replica": replica, "t": b[at] * self.bin_s}
        for name, dt, how in TIMELINE_FIELDS:
            if how == "count":
                out[name] = np.diff(np.append(at, len(b))).astype(dt)
            elif how == "busy":
                out[name] = np.add.reduceat((rows["end"] - rows["start"])[order], at)
            elif how == "max":
                out[name] = np.maximum.reduceat(rows[name][order], at).astype(dt)
            else:
                out[name] = np.add.reduceat(rows[name][order], at).astype(dt)
        self.inner.write(out)

    def close(self) -> None:
        if self._held is not None and len(self._held["end"]):
            self._emit(self._held, _bins(self._held["end"], self.bin_s))
        self._held = None
        self.inner.close(self.columns())


class AutoSteps:
    """A :class:`StepStream` sink that writes a row per step when the run has at most ``limit``
    steps, else a timeline: it holds the first ``limit + 1`` rows, then hands them and the rest to
    ``timeline()`` (a sink made when needed), or at the end to ``rows()``. ``mode`` says which
    (None until decided). Deterministic: the decision depends on the run's own step count."""

    def __init__(self, rows, timeline, limit: int) -> None:
        self._make = {"rows": rows, "timeline": timeline}
        self.limit, self.mode, self.sink = int(limit), None, None
        self._held: list[dict[str, np.ndarray]] = []
        self._n = 0

    @property
    def keeps_chunks(self) -> bool:
        """Whether a chunk's arrays must stay as they are after write (held until decided)."""
        return self.sink is None or getattr(self.sink, "keeps_chunks", True)

    def _decide(self, mode: str) -> None:
        self.mode, self.sink = mode, self._make[mode]()
        for c in self._held:
            self.sink.write(c)
        self._held = []

    def write(self, chunk: dict[str, np.ndarray]) -> None:
        if self.sink is not None:
            self.sink.write(chunk)
            return
        self._held.append(chunk)
        self._n += len(chunk["end"])
        if self._n > self.limit:
            self._decide("timeline")

    def close(self) -> None:
        if self.sink is None:
            self._decide("rows")
        self.sink.close()


class StepStream:
    """Where the engines write step records (``append`` one row, ``extend`` a block, as into
    :class:`Columns`): every row goes to ``totals`` (the summary's sums,
    batchsim.sim.aggregate.StepTotals) and, in the records' one canonical order (by end time,
    then replica, each replica's rows in its own order), to ``sink`` (``write(chunk)``,
    ``close()``), a chunk at a time, as rows become final: a row ending before the engine's
    clock (``settle(now)``) can no longer be preceded by one still to come, since every later
    step ends at or after ``now``. Memory holds at most about one chunk of rows, however long
    the run."""

    CHUNK = 1 << 18  # rows handed over at a time (at least)

    def __init__(self, totals, sink=None) -> None:
        self.totals, self.sink = totals, sink
        self._buf = Columns(STEP_FIELDS, self.CHUNK + 4096) if sink is not None else None
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, *values) -> None:
        self._count += 1
        self.totals.append(*values)
        buf = self._buf
        if buf is not None:
            buf.append(*values)
            if len(buf) >= self.CHUNK:
                self.settle(values[2])  # (the Python engine appends a step as it ends: at its clock)

    def extend(self, *columns, count: int | None = None) -> None:
        k = len(columns[0]) if count is None else count
        self._count += k
        self.totals.extend(*columns, count=count)
        if self._buf is not None:
            self._buf.extend(*columns, count=count)

    def reserve(self, k: int) -> tuple[int, list[np.ndarray]] | None:
        """Where the next ``k`` rows go in the step buffer's own arrays (:meth:`Columns.reserve`),
        for a writer that fills them in place and then calls :meth:`commit`; None without a
        buffer, or while appended rows wait."""
        return None if self._buf is None else self._buf.reserve(k)

    def commit(self, k: int) -> None:
        """The ``k`` rows :meth:`reserve` gave were written: they go on as :meth:`extend`'s do."""
        self._count += k
        self.totals.extend(*self._buf.commit(k), count=k)

    def settle(self, now: float, force: bool = False) -> None:
        """Hand the sink every row that ends before ``now``, in the canonical order, once at
        least :data:`CHUNK` rows wait (or when ``force``)."""
        buf = self._buf
        if buf is None or not len(buf) or (len(buf) < self.CHUNK and not force):
            return
        cols = {f: buf.column(f) for f, _ in STEP_FIELDS}
        end, rep = cols["end"], cols["replica"]
        ready = end < now
        if not ready.any():
            return
        k = int(ready.sum())
        if ready[:k].all() and _in_order(end[:k], rep[:k]):
            # (already in the canonical order, as one replica's rows always are: hand on views)
            self.sink.write({f: a[:k] for f, a in cols.items()})
            if not getattr(self.sink, "keeps_chunks", True):
                buf.drop_front(k)  # (the same arrays again: no new memory to fault in per chunk)
                return
            rest = {f: a[k:] for f, a in cols.items()}
        else:
            left = np.flatnonzero(~ready)
            rest = {f: a[left] for f, a in cols.items()}
            idx = np.flatnonzero(ready)
            order = idx[np.lexsort((rep[idx], end[idx]))]
            self.sink.write({f: a[order] for f, a in cols.items()})
        self._buf = Columns(STEP_FIELDS, self.CHUNK + 4096 + len(rest["end"]))
        if len(rest["end"]):
            self._buf.extend(*(rest[f] for f, _ in STEP_FIELDS))

    def close(self) -> None:
        """Hand over every row left and close the sink."""
        if self._buf is not None:
            self.settle(math.inf, force=True)
            self.sink.close()


REQUEST_COLUMNS = (
    "rid", "replica", "status", "reason", "arrival", "prompt_tokens", "output_tokens",
    "generated_tokens", "admitted", "first_token", "last_token", "completion",
    "ttft", "tpot", "e2el", "max_itl", "preemptions", "cached_tokens",
)


_REQUEST_DTYPES = {"status": object, "reason": object, "arrival": "f8", "admitted": "f8", "first_token": "f8",
                   "last_token": "f8", "completion": "f8", "ttft": "f8", "tpot": "f8", "e2el": "f8", "max_itl": "f8"}


def empty_requests() -> Table:
    """Request records with no rows, each column of its type (integers, times, words)."""
    return Table({c: np.empty(0, dtype=_REQUEST_DTYPES.get(c, "i8")) for c in REQUEST_COLUMNS})


def add_latencies(df):
    """Set ``ttft``, ``tpot`` and ``e2el`` (seconds, NaN where there is none) from the records'
    ``arrival``, ``first_token``, ``completion`` (NaN unless completed) and ``output_tokens``
    (a batchsim.sim.table.Table or a pandas frame, changed in place and returned): the one
    statement of the per-request latencies (docs: DESIGN.md, metrics)."""
    arrival = column(df, "arrival", np.float64)
    first = column(df, "first_token", np.float64)
    comp = column(df, "completion", np.float64)
    out = column(df, "output_tokens", np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        df["ttft"] = first - arrival
        df["tpot"] = np.where(~np.isnan(comp) & ~np.isnan(first) & (out > 1), (comp - first) / (out - 1), np.nan)
        df["e2el"] = comp - arrival
    return df


def request_frame(seqs: Iterable[Seq]):
    """One row per request, sorted by rid; latencies in seconds (NaN if none): a pandas frame."""
    import pandas as pd

    rows = []
    for s in seqs:
        ft = s.first_token
        comp = s.completion if s.status == COMPLETED else None
        rows.append((
            s.rid, s.replica, s.status, s.reason, s.arrival, s.prompt_tokens, s.output_tokens,
            s.num_generated, np.nan if s.admitted is None else s.admitted,
            np.nan if ft is None else ft, np.nan if s.last_token is None else s.last_token,
            np.nan if comp is None else comp, np.nan, np.nan, np.nan, s.max_itl, s.num_preemptions,
            s.cached_tokens,
        ))
    df = pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))
    df = df.sort_values("rid", kind="stable").reset_index(drop=True)
    return add_latencies(df) if len(df) else df
