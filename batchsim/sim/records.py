"""Flat records out of a run: one row per request, one per step, every ITL gap.

Records are the only thing ``batchsim/reports/`` and ``batchsim.sim.metrics`` read. Steps and
inter-token gaps go into preallocated numpy columns that double when full,
so a long run appends without allocating a Python object per row.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from batchsim.sim.state import COMPLETED, Seq

__all__ = ["Columns", "StepLog", "ItlLog", "STEP_FIELDS", "request_frame", "add_latencies"]

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

    def column(self, name: str) -> np.ndarray:
        self._settle()
        for (f, _), a in zip(self.fields, self._arrays):
            if f == name:
                return a[: self._n]
        raise KeyError(name)

    def frame(self) -> pd.DataFrame:
        self._settle()
        return pd.DataFrame({f: a[: self._n] for (f, _), a in zip(self.fields, self._arrays)})

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


class StepLog(Columns):
    """Per-step records of every replica."""

    def __init__(self, capacity: int = 4096) -> None:
        super().__init__(STEP_FIELDS, capacity)


class ItlLog(Columns):
    """Every inter-token gap, tagged with its request id."""

    def __init__(self, capacity: int = 4096) -> None:
        super().__init__((("rid", "i8"), ("gap", "f8")), capacity)


REQUEST_COLUMNS = (
    "rid", "replica", "status", "reason", "arrival", "prompt_tokens", "output_tokens",
    "generated_tokens", "admitted", "first_token", "last_token", "completion",
    "ttft", "tpot", "e2el", "max_itl", "preemptions", "cached_tokens",
)


def add_latencies(df: pd.DataFrame) -> pd.DataFrame:
    """Set ``ttft``, ``tpot`` and ``e2el`` (seconds, NaN where there is none) from the frame's
    ``arrival``, ``first_token``, ``completion`` (NaN unless completed) and ``output_tokens``:
    the one statement of the per-request latencies (docs: DESIGN.md, metrics)."""
    arrival = df["arrival"].to_numpy(dtype=np.float64)
    first = df["first_token"].to_numpy(dtype=np.float64)
    comp = df["completion"].to_numpy(dtype=np.float64)
    out = df["output_tokens"].to_numpy(dtype=np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        df["ttft"] = first - arrival
        df["tpot"] = np.where(~np.isnan(comp) & ~np.isnan(first) & (out > 1), (comp - first) / (out - 1), np.nan)
        df["e2el"] = comp - arrival
    return df


def request_frame(seqs: Iterable[Seq]) -> pd.DataFrame:
    """One row per request, sorted by rid; latencies in seconds (NaN if none)."""
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
