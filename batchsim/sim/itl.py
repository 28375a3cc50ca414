"""Every inter-token gap of a run, without a record per gap.

A decode step gives one token to every row it decodes, so a request that
runs without a break gets its tokens in consecutive token steps of its
replica (steps that emit tokens), and its gaps are the differences between
those steps' delivery times. The engines record (``batchsim.sim.engine``
``Replica._advance``; the compiled core's ``advance_and_record``):

- per replica, the delivery time of each token step (``times[r][k]``, when
  the client has the step's tokens: the step's end, or later through a
  frontend);
- per request, its *runs*: ``(rid, replica, start, end, entry)``, the
  request's tokens at token steps ``start..end`` of its replica, one per
  step, and ``entry`` the gap before the run's first token (NaN for the
  request's first token). A run ends when the request misses a token step
  of its replica (preempted, or not scheduled in a step that emitted).

A request's gaps are then, run by run, ``entry`` (unless NaN) and
``diff(times[replica][start:end + 1])``: exactly the floats ``now - last``
the engine computed, so any selection of requests (the measured window,
completed only), any cut (a frontend's stream after ``horizon_s``), the
whole distribution and each request's gaps are recovered exactly from
memory that grows with steps and requests, not with tokens.
:func:`weighted_percentile` reads percentiles from (value, count) pairs and
equals ``np.percentile`` over the repeated values.
"""

from __future__ import annotations

import contextlib
import math
import queue
import sys
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from batchsim.sim.handover import Handover

__all__ = ["EmptyError", "TokenSteps", "Packed", "pack", "Times", "ItlRecords", "ItlAhead", "FirstPass", "weighted_percentile",
           "weighted_summary", "RUN_FIELDS"]

RUN_FIELDS = ("rid", "replica", "start", "end", "entry")
_PIECE = 1 << 20  # token steps per piece of gaps (ItlRecords.pieces)
# NOTE: pieces of 2^20 steps make temporaries of 8 MB, which glibc's malloc reuses; at 2^22 (32 MB,
# its largest dynamic mmap threshold) freed temporaries stayed in the heap and the peak RSS of a
# million-request run grew by ~300 MB (1.33 GB -> 1.05 GB continuous, 3.23 -> 2.86 GB static)
# NOTE: weighted sums are numpy's pairwise sums of the products, never np.dot: a float dot goes to
# BLAS, whose sum over more than 10,000 values is split across its threads, so its last bits depend
# on the machine's core count (or OPENBLAS_NUM_THREADS); a summary must not
_sum = np.add.reduce


class EmptyError(ValueError):
    """A statistic of no values (:func:`weighted_summary`)."""


class TokenSteps:
    """What one replica's engine writes: its token steps' delivery times and the runs it closed
    (``(rid, replica, start, end, entry)``); open runs stay with their requests."""

    __slots__ = ("times", "closed")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.closed: list[tuple] = []


_SPLIT = 1 << 16  # times per packed chunk at most (a chunk is unpacked whole when read)
_NONE = np.zeros(0, dtype=np.int64)
_LITTLE = sys.byteorder == "little"
_HIGH = {40: np.uint8, 48: np.uint16}  # (the bits kept above the low 32, by width)


class Packed:
    """One chunk of token-step times in 4 to 6 B a time where 8 B would hold the floats: the first
    time's bit pattern, then each time's distance from the one before *in bit patterns* (as int64:
    for floats >= 0 the patterns are ordered as the values). A step of tens of milliseconds at a
    clock of hours is 10^8 to 10^10 patterns (the float's spacing there is 10^-12 to 10^-10 s), so a
    chunk keeps the distances' low 32 bits and, if more are needed, the next 8 or 16: the fewest
    bits that all but a 64th of its distances fit; those that do not (an idle gap of seconds, or
    anything unordered: int64 arithmetic wraps and unwraps exactly) are kept whole in ``far``. A
    chunk no width packs smaller keeps its floats (``raw``). :meth:`array` gives back the same
    float64 bits, whatever they were. A million-request static run keeps 242M token-step times:
    1.8 GiB as floats."""

    __slots__ = ("n", "head", "last", "low", "high", "far_at", "far", "raw")

    def __init__(self, t: np.ndarray) -> None:
        t = np.ascontiguousarray(t, dtype=np.float64)
        self.n = len(t)
        self.last = float(t[-1]) if self.n else math.nan
        self.head, self.low, self.high, self.far_at, self.far, self.raw = 0, None, None, _NONE, _NONE, None
        bits = t.view(np.int64)
        d = np.diff(bits)  # (wraps where it must; the cumulative sum wraps back)
        u = d.view(np.uint64)
        top = int(u.max()) if len(u) else 0
        for width in (32, 40, 48):
            if top < 1 << width:
                break
            far_at = np.flatnonzero(u >= np.uint64(1 << width))
            if len(far_at) * 64 <= len(u):
                self.far_at, self.far = far_at, d[far_at]
                break
        else:
            self.raw = t.copy()
            self.raw.flags.writeable = False  # (array() hands it out)
            return
        self.head = int(bits[0]) if self.n else 0
        self.low = d.astype(np.uint32)  # (truncated; those in far replaced when unpacked)
        if width > 32:
            kind = _HIGH[width]
            high = (d.view(kind).reshape(-1, 8 // kind().itemsize)[:, 4 // kind().itemsize].copy() if _LITTLE
                    else (u >> np.uint64(32)).astype(kind))  # (bits 32 up)
            high[self.far_at] = 0
            self.high = high

    def __len__(self) -> int:
        return self.n

    @property
    def nbytes(self) -> int:
        if self.raw is not None:
            return self.raw.nbytes
        return (self.low.nbytes + (0 if self.high is None else self.high.nbytes) + self.far_at.nbytes
                + self.far.nbytes)

    def array(self) -> np.ndarray:
        """The times, float64, the bits they were packed from (do not write to it)."""
        if self.raw is not None:
            return self.raw
        s = np.empty(self.n, dtype=np.int64)
        if self.n:
            s[0] = self.head
            s[1:] = self.low
            if self.high is not None:
                s[1:] += self.high.astype(np.int64) << 32
            s[1 + self.far_at] = self.far
            np.cumsum(s, out=s)
        out = s.view(np.float64)
        out.flags.writeable = False  # (Times keeps it for the next read)
        return out


def pack(t: np.ndarray) -> list[Packed]:
    """``t`` as :class:`Packed` chunks of at most :data:`_SPLIT` times."""
    t = np.asarray(t, dtype=np.float64)
    return [Packed(t[i:i + _SPLIT]) for i in range(0, len(t), _SPLIT)]


class Times:
    """One replica's token-step times, kept :class:`Packed` in the chunks they were made in (no
    copy into one array: a million-request static run has 240M of them), each unpacked when read
    (the last one read is kept). Sliced like an array."""

    __slots__ = ("_chunks", "_ends", "_starts", "_lasts", "_seen")

    def __init__(self, chunks: Sequence) -> None:
        self._chunks: list[Packed] = []
        floats: list[np.ndarray] = []  # (consecutive float chunks, packed together)
        for c in chunks:
            if isinstance(c, Packed):
                if floats:
                    self._chunks += pack(np.concatenate(floats))
                    floats = []
                if len(c):
                    self._chunks.append(c)
            elif len(c):
                floats.append(np.asarray(c, dtype=np.float64))
        if floats:
            self._chunks += pack(np.concatenate(floats))
        self._ends = np.cumsum([len(c) for c in self._chunks], dtype=np.int64)
        self._starts = [0, *self._ends[:-1].tolist()]  # (where each chunk begins)
        self._lasts = np.array([c.last for c in self._chunks], dtype=np.float64)
        self._seen: tuple = (-1, None)  # (the chunk last unpacked: a piece's edge reads it twice)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._chunks)

    def _chunk(self, k: int) -> np.ndarray:
        seen = self._seen  # (one read of the pair: another thread may replace it)
        if seen[0] != k:
            seen = (k, self._chunks[k].array())
            self._seen = seen
        return seen[1]

    def __getitem__(self, key: slice) -> np.ndarray:
        a, b, step = key.indices(len(self))
        if step != 1:  # pragma: no cover - not used
            raise ValueError("Times slices take step 1")
        if b <= a:
            return np.zeros(0)
        i = int(np.searchsorted(self._ends, a, "right"))
        j = int(np.searchsorted(self._ends, b - 1, "right"))
        starts = self._starts
        parts = [self._chunk(k)[max(a - starts[k], 0):b - starts[k]] for k in range(i, j + 1)]
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)

    def gaps(self, lo: int, hi: int) -> np.ndarray:
        """``self[lo:hi] - self[lo - 1:hi - 1]`` (the step gaps ``lo..hi-1``; ``1 <= lo <= hi``),
        each chunk's differences written into one array, the chunks never joined first."""
        out = np.empty(hi - lo)
        starts = self._starts
        i = int(np.searchsorted(self._ends, lo - 1, "right"))  # (the chunk holding time lo - 1)
        x = lo  # (the next gap: self[x] - self[x - 1])
        while x < hi:
            c, s = self._chunk(i), starts[i]
            if x - 1 < s:  # (its earlier time is the last of the chunk before)
                out[x - lo] = c[0] - self._lasts[i - 1]
                x += 1
            e = min(s + len(c), hi)  # (gaps x..e-1 end in this chunk)
            if x < e:
                np.subtract(c[x - s:e - s], c[x - 1 - s:e - 1 - s], out=out[x - lo:e - lo])
                x = e
            i += 1
        return out

    def count_at_most(self, x: float) -> int:
        """How many times are <= x. The times never decrease (the engines deliver in time order),
        so the chunks whose last time is <= x are counted whole."""
        j = int(np.searchsorted(self._lasts, x, "right"))  # (chunks wholly <= x)
        n = int(self._ends[j - 1]) if j else 0
        if j < len(self._chunks):
            n += int(np.searchsorted(self._chunk(j), x, "right"))
        return n

    def head(self, n: int) -> "Times":
        """The first ``n`` times: the whole chunks as they are, the one cut packed anew."""
        if n >= len(self):
            return self
        j = int(np.searchsorted(self._ends, n, "right"))  # (chunks wholly among the first n)
        done = int(self._ends[j - 1]) if j else 0
        return Times(self._chunks[:j] + [self._chunk(j)[:n - done].copy()])


class ItlRecords:
    """The token-step times and request runs of one run (see the module docstring)."""

    __slots__ = ("times", "rid", "replica", "start", "end", "entry", "ahead")

    def __init__(self, times: Sequence, rid, replica, start, end, entry) -> None:
        self.ahead: ItlAhead | None = None  # (the first pieces' first pass, made as the run went)
        self.times = [t if isinstance(t, Times) else Times([t]) for t in times]
        rid = np.asarray(rid, dtype=np.int64)
        start = np.asarray(start, dtype=np.int64)
        order = np.lexsort((start, rid))  # (one canonical order: by request, then time)
        self.rid, self.start = rid[order], start[order]
        self.replica = np.asarray(replica, dtype=np.int64)[order]
        self.end = np.asarray(end, dtype=np.int64)[order]
        self.entry = np.asarray(entry, dtype=np.float64)[order]

    @classmethod
    def empty(cls, replicas: int = 1) -> "ItlRecords":
        z = np.zeros(0, dtype=np.int64)
        return cls([np.zeros(0)] * replicas, z, z, z, z, np.zeros(0))

    @classmethod
    def build(cls, times: Sequence[np.ndarray], closed: Sequence[Sequence], open_runs: Sequence[np.ndarray]) -> "ItlRecords":
        """From the runs the engines closed (five columns, :data:`RUN_FIELDS`) and the runs still
        open at the end, by rid (``replica`` -1 where a request has none; ``start, end, entry``)."""
        rep, start, end, entry = (np.asarray(a) for a in open_runs)
        live = np.flatnonzero(rep >= 0)
        cols = [np.concatenate([np.asarray(c, dtype=dt), o]) for c, dt, o in zip(
            closed, ("i8", "i8", "i8", "i8", "f8"), (live, rep[live], start[live], end[live], entry[live]))]
        return cls(times, *cols)

    def __len__(self) -> int:
        """How many gaps."""
        return int((self.end - self.start).sum() + (~np.isnan(self.entry)).sum())

    def __eq__(self, other) -> bool:
        if not isinstance(other, ItlRecords):
            return NotImplemented
        return (len(self.times) == len(other.times)
                and all(np.array_equal(a[:], b[:]) for a, b in zip(self.times, other.times))
                and all(np.array_equal(getattr(self, f), getattr(other, f), equal_nan=f == "entry")
                        for f in RUN_FIELDS))

    __hash__ = None  # type: ignore[assignment]

    def select(self, keep: np.ndarray) -> "ItlRecords":
        """The runs of the requests ``keep`` marks (a boolean mask by rid)."""
        keep = np.asarray(keep, dtype=bool)
        m = np.zeros(len(self.rid), dtype=bool)
        inside = self.rid < len(keep)
        m[inside] = keep[self.rid[inside]]
        out = ItlRecords(self.times, *(getattr(self, f)[m] for f in RUN_FIELDS))
        if m.all():  # (the same runs: the same pieces)
            out.ahead = self.ahead
        return out

    def first_pass(self, transform: Callable = lambda v, c: (v, c)) -> tuple:
        """``(first, rest)`` for :func:`weighted_summary` over ``transform``'s pieces: the first pass
        :attr:`ahead` made and the pieces after its own, or ``(None, None)`` when there is none."""
        ahead = self.ahead
        if ahead is None or ahead.failed or ahead.transform is not transform:
            return None, None
        return ahead.first, lambda: (transform(v, c) for v, c in self.pieces(start=[ahead.next_lo]))

    def clip(self, horizon: float) -> tuple["ItlRecords", np.ndarray]:
        """The gaps the clients have by ``horizon`` (tokens delivered after it dropped) and the rids
        that lost some."""
        cut = [t.count_at_most(horizon) for t in self.times]
        kept = np.array(cut, dtype=np.int64)[self.replica] if len(self.rid) else np.zeros(0, dtype=np.int64)
        lost = self.end >= kept
        if not lost.any():
            return self, np.zeros(0, dtype=np.int64)
        live = self.start < kept
        end = np.minimum(self.end, kept - 1)
        out = ItlRecords([t.head(c) for t, c in zip(self.times, cut)], self.rid[live], self.replica[live],
                         self.start[live], end[live], self.entry[live])
        return out, np.unique(self.rid[lost])

    def pieces(self, start: Sequence[int] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every gap as ``(values, counts)`` pieces (seconds; counts > 0), a bounded number of
        token steps at a time: each step gap with how many runs cover it, then the runs' entry
        gaps. Memory: one piece, however many gaps. ``start``: per replica, the step gap its
        pieces begin at (1, or past pieces already summed: :class:`ItlAhead`)."""
        for r, t in enumerate(self.times):
            m = self.replica == r
            if len(t) < 2 or not m.any():
                continue
            a = np.sort(self.start[m] + 1)  # (a run covers the step gaps start+1 .. end)
            b = np.sort(self.end[m] + 1)
            for lo in range(1 if start is None else start[r], len(t), _PIECE):
                got = _piece(t, a, b, lo, min(lo + _PIECE, len(t)))
                if got is not None:
                    yield got
        e = self.entry[~np.isnan(self.entry)]
        if len(e):
            yield e, np.ones(len(e), dtype=np.int64)

    def weighted(self) -> tuple[np.ndarray, np.ndarray]:
        """Every gap as ``(values, counts)``: :meth:`pieces` joined."""
        got = list(self.pieces())
        if not got:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        return np.concatenate([v for v, _ in got]), np.concatenate([c for _, c in got]).astype(np.int64)

    def weighted_frame(self):
        """:meth:`weighted` as a pandas frame (``gap``, ``count``): what reports read."""
        import pandas as pd

        v, c = self.weighted()
        return pd.DataFrame({"gap": v, "count": c})

    def frame(self):
        """One row per gap (``rid``, ``gap``): by request, each request's gaps in time order. Memory
        grows with tokens: for tests and for per-request exports (``vllm bench --save-detailed``'s
        ``itls``); a pandas frame."""
        import pandas as pd

        rids, gaps = [None] * len(self.rid), [None] * len(self.rid)
        # (read in time order, each replica's chunks unpacked once; kept in the runs' order)
        for k in np.lexsort((self.start, self.replica)).tolist():
            rid, rep, a, b, e = (int(self.rid[k]), int(self.replica[k]), int(self.start[k]), int(self.end[k]),
                                 float(self.entry[k]))
            g = self.times[rep].gaps(a + 1, b + 1)
            if not math.isnan(e):
                g = np.concatenate(([e], g))
            rids[k] = np.full(len(g), rid, dtype=np.int64)
            gaps[k] = g
        if not gaps:
            return pd.DataFrame({"rid": np.zeros(0, dtype=np.int64), "gap": np.zeros(0)})
        return pd.DataFrame({"rid": np.concatenate(rids), "gap": np.concatenate(gaps)})

    def max_per_request(self, rids: np.ndarray) -> np.ndarray:
        """Each of ``rids``' largest gap (0.0 where it has none)."""
        rids = np.asarray(rids, dtype=np.int64)
        out = np.zeros(len(rids))
        if not len(rids):
            return out
        mask = np.zeros(int(max(rids.max(), self.rid.max(initial=-1))) + 1, dtype=bool)
        mask[rids] = True
        f = self.select(mask).frame()
        if len(f):
            top = f.groupby("rid")["gap"].max()
            out = top.reindex(rids).fillna(0.0).to_numpy()
        return out


def _piece(t: Times, a: np.ndarray, b: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The step gaps ``lo..hi-1`` of one replica's token-step times ``t`` that runs cover, with how
    many cover each (None when none is): :meth:`ItlRecords.pieces`' piece. ``a``, ``b``: the runs'
    ``start + 1`` and ``end + 1``, sorted; only those of runs that cover a gap of the piece or
    begin before it matter (a run that ends before ``lo`` counts in neither or both of ``a0, b0``)."""
    a0, a1 = np.searchsorted(a, (lo, hi))
    b0, b1 = np.searchsorted(b, (lo, hi))
    # (the coverage is constant between the places where a run begins (+1) or ends
    # (-1): few, so it is found per stretch and then repeated over each stretch)
    at = np.concatenate(([0], a[a0:a1] - lo, b[b0:b1] - lo))
    delta = np.concatenate(([int(a0) - int(b0)], np.ones(a1 - a0, dtype=np.int64),
                            np.full(b1 - b0, -1, dtype=np.int64)))
    order = np.argsort(at, kind="stable")
    at = at[order]
    level = np.cumsum(delta[order])  # (each stretch's coverage; stretches between equal places are empty)
    length = np.diff(np.append(at, hi - lo))
    covered = level > 0
    if covered[length > 0].all():  # (every step gap of the piece covered, as in a busy replica)
        return t.gaps(lo, hi), np.repeat(level, length)
    if length[covered].any():
        return t.gaps(lo, hi)[np.repeat(covered, length)], np.repeat(level[covered], length[covered])
    return None


class ItlAhead:
    """The first pass of a one-replica run's pieces (:class:`FirstPass` over ``transform(values,
    counts)``), made as the run goes: the compiled core hands over each block's token-step times,
    the runs it closed and its frontier (``core_frontier``: every run that covers an earlier step
    gap is closed), and each whole piece of :meth:`ItlRecords.pieces` that ends by then is made
    from the closed runs (:func:`_piece`: the same values and counts) and counted in, in order.
    The summary then adds the pieces from :attr:`next_lo` on and the entry gaps
    (:meth:`ItlRecords.first_pass`), when the runs it sums are every run of the records
    (:meth:`ItlRecords.select` keeps it only then): the same pieces, in the same order, summed the
    same way, so the same bits as the first pass after the run.

    NOTE: while the core's thread runs, the main thread has time to spare (1M static: it reads for
    29 s of CPU, this pass included, beside the core's 31 s), so this half of the ITL summary's
    work (~4 s after the run there) costs little wall time; one replica only (the pieces go replica
    by replica, and the sum's order with them)."""

    def __init__(self, transform: Callable) -> None:
        self.transform = transform
        self.first = FirstPass()
        self.next_lo = 1  # the first step gap of the next piece
        self.pieces = 0  # pieces made
        self.failed = False  # (a piece the first pass refused: the summary makes it again, and says why)
        self._chunks: list[np.ndarray] = []  # token-step times from _base on
        self._base = 0
        self._k = 0  # token steps so far
        self._a = np.zeros(0, dtype=np.int64)  # closed runs' start + 1 and end + 1 (those ending before next_lo dropped)
        self._b = np.zeros(0, dtype=np.int64)

    def feed(self, times: "Packed | np.ndarray | None", start: np.ndarray | None, end: np.ndarray | None, frontier: int) -> None:
        """A block's token-step times, the starts and ends of the runs closed in it, and the core's
        frontier after it."""
        if times is not None and len(times):
            self._chunks.append(times)
            self._k += len(times)
        if start is not None and len(start):
            self._a = np.concatenate((self._a, start + 1))
            self._b = np.concatenate((self._b, end + 1))
        ready = min(self._k, int(frontier) + 1)  # (pieces ending by here: hi <= ready)
        while not self.failed and self.next_lo + _PIECE <= ready:
            self._one(self.next_lo, self.next_lo + _PIECE)

    def _one(self, lo: int, hi: int) -> None:
        base = self._base  # (indices from _base on: the chunks before it were dropped)
        got = _piece(Times(self._chunks), np.sort(self._a) - base, np.sort(self._b) - base, lo - base, hi - base)
        if got is not None:
            try:
                self.first.add(*self.transform(*got))
            except ValueError:
                self.failed = True
                return
            self.pieces += 1
        self.next_lo = hi
        keep = self._b >= hi  # (a run ending before the next piece counts in neither or both of its a0, b0)
        self._a, self._b = self._a[keep], self._b[keep]
        while self._chunks and base + len(self._chunks[0]) <= hi - 1:  # (the next piece reads times from hi - 1)
            base += len(self._chunks.pop(0))
        self._base = base


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's ``_lerp`` (np.percentile's 'linear' interpolation), on floats."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


_KEY_SHIFT = np.uint64(36)  # buckets keep the exponent and 16 bits of the mantissa: 0.0015% wide
_KEY_FLOOR = int(np.array(1e-12).view(np.uint64) >> _KEY_SHIFT)  # values below 1e-12 share one bucket
_SIGN = np.uint64(0x7FFFFFFFFFFFFFFF)
# NOTE: up to this many distinct (value, count) pairs are sorted outright: the histogram spans every
# bucket between the smallest and largest value (~65,536 per binade), which costs more than a sort
# of a few thousand values (a plan point's gaps: 2 ms -> 0.1 ms)
_FEW = 1 << 16


def _keys(v: np.ndarray) -> np.ndarray:
    """A bucket per value, in value order for values >= 0 (-0.0 too): the float's exponent and
    leading mantissa bits, values below 1e-12 in one bucket (so the histogram spans only the
    exponents the values have)."""
    k = v.view(np.uint64) & _SIGN
    k >>= _KEY_SHIFT
    return np.maximum(k, np.uint64(_KEY_FLOOR), out=k).view(np.int64)  # (keys < 2^28: the same as integers)


def _add_hist(hist: np.ndarray, base: int, v: np.ndarray, c: np.ndarray, least: float, most: float) -> tuple[np.ndarray, int]:
    """``hist`` (counts of keys ``base, base + 1, ...``) with the keys of the values ``v`` (>= 0,
    from ``least`` to ``most``) counted ``c`` times (integers, or the same as floats)."""
    lo, hi = _keys(np.array([least, most])).tolist()  # (keys keep the values' order)
    if not len(hist):
        hist, base = np.zeros(hi - lo + 1, dtype=np.int64), lo
    new_lo, new_hi = min(base, lo), max(base + len(hist) - 1, hi)
    if new_lo < base or new_hi >= base + len(hist):
        grown = np.zeros(new_hi - new_lo + 1, dtype=np.int64)
        grown[base - new_lo:base - new_lo + len(hist)] = hist
        hist, base = grown, new_lo
    k = _keys(v)
    k -= lo
    h = np.bincount(k, weights=c).astype(np.int64)
    hist[lo - base:lo - base + len(h)] += h
    return hist, base


_AHEAD = 1 << 18  # values in a piece from which the pieces after it are made on a thread (_ahead)


def _ahead(items: Iterable[tuple[np.ndarray, np.ndarray]], depth: int = 2) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``items`` in their order. Once one holds :data:`_AHEAD` values or more (a long run's
    gaps), the rest are made on a thread, at most ``depth`` ahead, while the caller works on the
    ones before (numpy lets go of the GIL): what is made and what is summed, in what order, is
    the same either way. Small inputs (a plan point's) never start a thread."""
    it = iter(items)
    for item in it:
        yield item
        if len(item[0]) >= _AHEAD:
            break
    else:
        return
    # NOTE: the caller's thread waits only in SimpleQueue.get, a lock acquired in C: a signal
    # handler's exception (Ctrl-C) leaves it cleanly, where a Queue's Python-level Condition.wait
    # can be left with its lock released twice ("release unlocked lock" instead of the interrupt).
    # The bound (``depth`` made ahead) is a second SimpleQueue of free slots.
    made: queue.SimpleQueue = queue.SimpleQueue()
    slots: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(depth):
        slots.put(None)
    h = Handover()  # (the thread's start and stop, right wherever an interrupt lands)

    def make() -> None:
        try:
            while True:
                while True:  # (a free slot first, then the next item: none is read once stopped)
                    if h.stop:
                        return
                    try:
                        slots.get(timeout=0.1)
                        break
                    except queue.Empty:
                        continue
                if h.stop:
                    return
                try:
                    x = next(it)
                except StopIteration:
                    break
                made.put((1, x))
            made.put((0, None))
        except BaseException as e:  # (raised where the items are read)
            made.put((2, e))

    try:
        h.start(make)  # (inside: an interrupt while it starts still stops it)
        while True:
            kind, x = made.get()
            if kind == 0:
                return
            if kind == 2:
                raise x
            slots.put(None)
            yield x
    finally:
        # (a store, before anything that checks for signals: the thread stops even where an
        # interrupt at the loop's back edge below, outside its try, leaves the loop)
        h.stop = True
        late = None  # (a further interrupt while the thread stops: raised once it has, within 0.1 s
        while True:  # and the piece it is making)
            try:
                if h.halt():  # (one not begun reads nothing)
                    h.wait()
                break
            except BaseException as e:
                late = e
        if late is not None:
            raise late


class FirstPass:
    """:func:`weighted_summary`'s first pass over ``(values, counts)`` pieces (values >= 0), one
    piece at a time, in the pieces' order (:meth:`add`): the count, the sum (each piece's weighted
    sum added in turn) and a histogram of fine buckets (:func:`_keys`); up to ``_FEW`` values, the
    pieces themselves instead of the histogram (then no second pass)."""

    __slots__ = ("n", "total", "hist", "base", "kept", "few")

    def __init__(self) -> None:
        self.n, self.total, self.hist, self.base = 0, 0.0, np.zeros(0, dtype=np.int64), 0
        self.kept: list | None = []  # the pieces themselves while they are few (then no histogram, one pass)
        self.few = 0

    def copy(self) -> "FirstPass":
        out = FirstPass()
        out.n, out.total, out.hist, out.base, out.few = self.n, self.total, self.hist.copy(), self.base, self.few
        out.kept = None if self.kept is None else list(self.kept)
        return out

    def add(self, v: np.ndarray, c: np.ndarray) -> None:
        """Count the piece ``(v, c)`` in, after every piece added before."""
        if not len(v):
            return
        least, most = float(v.min()), float(v.max())
        if not least >= 0:  # (NaN too)
            raise ValueError(f"weighted_summary needs values >= 0, got {least!r}")
        self.n += int(c.sum())
        cf = c.astype(np.float64)  # (the products' and the histogram's counts: converted once)
        self.total += float(_sum(v * cf))  # (the same products as v * c: numpy converts c to these floats)
        if self.kept is not None:
            self.kept.append((v, c))
            self.few += len(v)
            if self.few <= _FEW:
                return
            for x, y in self.kept:
                self.hist, self.base = _add_hist(self.hist, self.base, x, y, float(x.min()), float(x.max()))
            self.kept = None
        else:
            self.hist, self.base = _add_hist(self.hist, self.base, v, cf, least, most)


def weighted_summary(pieces: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]],
                     percentiles: Sequence[float], first: FirstPass | None = None,
                     rest: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]] | None = None,
                     ) -> tuple[int, float, float, list[float]]:
    """``(n, mean, std, [percentile...])`` of the multiset the ``(values, counts)`` pieces make
    (values >= 0; ``pieces()`` is called twice and must give the same pieces): the percentiles
    equal ``np.percentile(np.repeat(values, counts), p)`` (its default 'linear' method) exactly;
    mean and std are the weighted sums (numpy's ``mean``/``std`` within rounding). Two passes:
    the count, sum and a histogram of fine buckets (:class:`FirstPass`), then the sum of squares
    and the values of the buckets that hold the ranks the percentiles need, sorted. Up to
    ``_FEW`` pieces' values, one pass: the kept values sorted outright. ``first``: the first pass
    over the pieces before those of ``rest()`` already made (:class:`ItlAhead`): the same bits."""
    first, rest = (FirstPass(), pieces) if first is None else (first.copy(), rest)
    with contextlib.closing(_ahead(rest())) as made:  # (closed as an error leaves: its thread stops)
        for v, c in made:
            first.add(v, c)
    n, total, hist, base, kept = first.n, first.total, first.hist, first.base, first.kept
    if n == 0:
        raise EmptyError("no values")
    mean = total / n
    plans = []
    for p in percentiles:
        h = (n - 1) * (float(p) / 100)  # (numpy: q = p / 100; virtual index (n - 1) * q)
        if h >= n - 1:
            plans.append((n - 1, n - 1, 0.0))
        else:
            lo = math.floor(h)
            plans.append((lo, lo + 1, h - lo))
    ranks = sorted({r for lo, hi, _ in plans for r in (lo, hi)})
    if kept is not None:  # few values: the ranks from one sort of them all (the same values, exactly)
        sq = sum((_squares(v, c, mean) for v, c in kept), 0.0)
        at_rank = _at_ranks(kept, ranks)
    else:
        cum = np.cumsum(hist)
        where = {r: int(np.searchsorted(cum, r, "right")) for r in ranks}
        wanted = np.array(sorted({b + base for b in where.values()}), dtype=np.int64)
        sq = 0.0
        found: dict[int, list] = {int(b): [] for b in wanted}
        lut = np.zeros(len(hist), dtype=bool)  # (every key is in the histogram's span: the first pass's)
        lut[wanted - base] = True
        with contextlib.closing(_ahead(pieces())) as made:
            for v, c in made:
                sq += _squares(v, c, mean)
                if not len(v):
                    continue
                lo, hi = _keys(np.array([v.min(), v.max()])).tolist()
                if lo < base or hi >= base + len(hist):
                    raise ValueError("weighted_summary: pieces() gave other values the second time")
                k = _keys(v)
                k -= base
                sel = np.flatnonzero(lut[k])
                for b in np.unique(k[sel]).tolist():
                    at = sel[k[sel] == b]
                    found[b + base].append((v[at], c[at]))
        at_rank = {}
        for r, b in where.items():  # (the rank within its bucket: past the buckets before it)
            within = r - (int(cum[b - 1]) if b else 0)
            at_rank[r] = _at_ranks(found[b + base], [within])[within]
    return n, mean, math.sqrt(sq / n), [_lerp(at_rank[lo], at_rank[hi], g) for lo, hi, g in plans]


def _squares(v: np.ndarray, c: np.ndarray, mean: float) -> float:
    """The weighted sum of squared deviations of one piece."""
    d = v - mean
    np.multiply(d, d, out=d)  # (what ** 2 computes)
    np.multiply(d, c, out=d)
    return float(_sum(d))


def _at_ranks(pieces: list, ranks) -> dict[int, float]:
    """The value at each 0-based rank of the values of ``pieces`` (``(values, counts)``), each
    repeated its count: one stable sort of them all."""
    vals = np.concatenate([v for v, _ in pieces])
    order = np.argsort(vals, kind="stable")
    cum = np.cumsum(np.concatenate([c for _, c in pieces])[order])
    return {r: float(vals[order][int(np.searchsorted(cum, r, "right"))]) for r in ranks}


def weighted_percentile(values: np.ndarray, counts: np.ndarray, percentiles: Sequence[float]) -> list[float]:
    """``np.percentile(np.repeat(values, counts), p)`` for each p, exactly, without repeating the
    values (:func:`weighted_summary`)."""
    v = np.asarray(values, dtype=np.float64)
    c = np.asarray(counts, dtype=np.int64)
    return weighted_summary(lambda: [(v, c)], percentiles)[3]
