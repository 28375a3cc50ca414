"""Running totals of the step records: what the summary's utilization figures are made of.

Every run's step records go to :class:`StepTotals` (through batchsim.sim.records.StepStream),
kept or not: the sums the utilization figures need (busy time, tokens, FLOPs, bytes, ...),
in memory that does not grow with the run.

Determinism: each replica's records are reduced in fixed chunks of its own
steps, then chunk sums are added in order and replicas in index order.
Records arrive per replica in step order, one step or (from the compiled
core) one block at a time, and blocks are split at chunk boundaries, so every
total is bit-identical across engines and replica interleavings.
"""

from __future__ import annotations

import math

import numpy as np

from batchsim.sim.records import STEP_FIELDS
from batchsim.sim.records import write_waiting

__all__ = ["StepTotals", "STEP_CHUNK"]

STEP_CHUNK = 4096

_SUMS = ("busy", "compute_s", "memory_s", "useful_flops", "bytes")
_INTS = ("prefill_tokens", "decode_tokens", "padding_tokens", "num_seqs", "out_of_range", "steps")

# The step fields the totals read ("busy" is end - start), by position in
# STEP_FIELDS: only these are kept.
_STEP_NAMES = [f for f, _ in STEP_FIELDS]
_KEEP = tuple(_STEP_NAMES.index(f) for f in ("start", "end") + _SUMS[1:] + _INTS[:-1])
_KEEP_DTYPES = tuple(STEP_FIELDS[i][1] for i in _KEEP)
_START, _END = 0, 1  # positions in the kept columns
_SUM_COLS = tuple(enumerate(_SUMS[1:], 2))
_INT_COLS = tuple(enumerate(_INTS[:-1], 2 + len(_SUMS) - 1))


def _same_sum(chunk: np.dtype, given: np.dtype) -> bool:
    """Whether ``given`` values sum as they would once written into a ``chunk`` column: the same
    float type, or integers of any size (numpy sums them exactly, in 64 bits)."""
    return given == chunk or (given.kind in "iu" and chunk.kind in "iu")


class _Chunk:
    """One replica's unfinished chunk.

    Its first ``n`` rows are in ``arrays``. Then come ``waiting`` values (step
    rows as appended, or gaps from lists), not yet written, and ``skipped``
    rows that blocks wrote meanwhile straight to their places: ``(i, k)`` in
    ``skips`` is k rows after the first i waiting ones. ``_Chunked._settle``
    writes the waiting values to the places kept for them.
    """

    __slots__ = ("arrays", "n", "waiting", "skips", "skipped")

    def __init__(self, dtypes, size: int) -> None:
        self.arrays = [np.empty(size, dtype=dt) for dt in dtypes]
        self.n = 0
        self.waiting: list = []
        self.skips: list[tuple[int, int]] = []
        self.skipped = 0

    def __len__(self) -> int:
        return self.n + len(self.waiting) + self.skipped


class _Chunked:
    """Per-replica fixed-size chunks; subclasses reduce a full chunk.

    Every value is converted exactly as ``array[i] = value`` would convert it
    and lands in the same place of the same chunk as if each row were written
    as it came, so waiting before being written changes nothing.
    """

    def __init__(self, replicas: int, dtypes, chunk: int) -> None:
        self._chunk = chunk
        self._bufs = [_Chunk(dtypes, chunk) for _ in range(replicas)]

    def _add(self, replica: int, columns, count: int) -> None:
        """Write ``count`` rows (arrays of at least ``count`` values, or
        scalars) after the replica's rows so far, reducing each full chunk."""
        buf, chunk = self._bufs[replica], self._chunk
        waiting = len(buf.waiting)
        n = buf.n + waiting + buf.skipped
        if n + count < chunk:  # fits in the chunk: no slicing
            s = slice(n, n + count)
            try:
                for a, c in zip(buf.arrays, columns):
                    a[s] = c
            except ValueError:  # an array longer than count: its first count values, below
                pass
            else:
                if waiting:
                    buf.skips.append((waiting, count))
                    buf.skipped += count
                else:
                    buf.n = n + count
                return
        if waiting:
            self._settle(replica, buf)
        # (whole chunks of the block are reduced where they are when that sums the same values)
        in_place = all(isinstance(c, np.ndarray) and _same_sum(a.dtype, c.dtype) for a, c in zip(buf.arrays, columns))
        done = 0
        while done < count:
            n = buf.n
            take = min(count - done, chunk - n)
            if take == chunk and in_place:
                # (whole chunks of the block: reduced where they are, the same values in the same order;
                # floats only of the chunk's own type, integers of any: their sums are exact)
                m = (count - done) // chunk
                self._reduce_chunks(replica, [c[done:done + m * chunk] for c in columns], m, chunk)
                done += m * chunk
                continue
            for a, c in zip(buf.arrays, columns):
                a[n:n + take] = c[done:done + take] if isinstance(c, np.ndarray) else c
            buf.n = n + take
            done += take
            if buf.n == chunk:
                self._reduce(replica, buf)
                buf.n = 0

    def _waiting_columns(self, waiting: list) -> list:  # pragma: no cover - abstract
        """The waiting values, one sequence per column."""
        raise NotImplementedError

    def _settle(self, replica: int, buf: _Chunk) -> None:
        """Write the waiting values to their places; those past the chunk's
        end (gaps only) go on into the next chunks."""
        waiting = buf.waiting
        k = len(waiting)
        if not k:
            return
        columns = self._waiting_columns(waiting)
        buf.waiting = []
        n, chunk = buf.n, self._chunk
        fit = min(k, chunk - n - buf.skipped)
        part = columns if fit == k else [v[:fit] for v in columns]
        write_waiting(buf.arrays, n, part, buf.skips)
        buf.n = n + fit + buf.skipped
        buf.skips = []
        buf.skipped = 0
        if buf.n == chunk:
            self._reduce(replica, buf)
            buf.n = 0
        if fit < k:
            self._add(replica, [np.array(v[fit:], dtype=a.dtype) for a, v in zip(buf.arrays, columns)], k - fit)

    def _flush(self) -> None:
        for i, buf in enumerate(self._bufs):
            self._settle(i, buf)
            if buf.n:
                self._reduce(i, buf)
                buf.n = 0

    def _reduce(self, replica: int, buf: _Chunk) -> None:
        n = buf.n
        self._reduce_chunks(replica, buf.arrays if n == self._chunk else [a[:n] for a in buf.arrays], 1, n)

    def _reduce_chunks(self, replica: int, cols: list, m: int, width: int) -> None:  # pragma: no cover - abstract
        """Reduce ``m`` chunks in a row, ``width`` rows each: arrays of ``m * width`` rows, one per
        column (each chunk reduced as it would be alone, in order)."""
        raise NotImplementedError


class StepTotals(_Chunked):
    """Running sums of the step records (what batchsim.sim.records.StepStream feeds: append, extend)."""

    def __init__(self, replicas: int) -> None:
        super().__init__(replicas, _KEEP_DTYPES, STEP_CHUNK)
        self._f = [dict.fromkeys(_SUMS, 0.0) for _ in range(replicas)]
        self._i = [dict.fromkeys(_INTS, 0) for _ in range(replicas)]
        self.max_end = -math.inf
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, *values) -> None:
        # the row waits whole; _settle writes the kept fields of many at once
        self._count += 1
        buf = self._bufs[values[0]]
        waiting = buf.waiting
        waiting.append(values)
        if buf.n + len(waiting) + buf.skipped == STEP_CHUNK:
            self._settle(values[0], buf)

    def extend(self, *columns, count: int | None = None) -> None:
        k = len(columns[0]) if count is None else count
        if not k:
            return
        self._count += k
        replica = columns[0]
        replica = int(replica[0]) if isinstance(replica, np.ndarray) else int(replica)
        self._add(replica, [columns[i] for i in _KEEP], k)

    def _waiting_columns(self, rows: list) -> list:
        fields = list(zip(*rows))
        return [fields[i] for i in _KEEP]

    def _reduce_chunks(self, replica: int, cols: list, m: int, width: int) -> None:
        # (each chunk's float sums a row of one (m, width) view, added in chunk order; integer
        # sums are exact in any grouping)
        end = cols[_END]
        f, i = self._f[replica], self._i[replica]
        for name, a in (("busy", end - cols[_START]), *((name, cols[j]) for j, name in _SUM_COLS)):
            total = f[name]
            for v in a.reshape(m, width).sum(axis=1).tolist():
                total += v
            f[name] = total
        for j, name in _INT_COLS:
            i[name] += int(cols[j].sum())
        i["steps"] += m * width
        self.max_end = max(self.max_end, float(end.max()))

    def totals(self, replicas: range | None = None) -> dict:
        """Sums over every replica, or those in ``replicas`` (a disaggregated deployment's pool), in
        index order."""
        self._flush()
        out: dict = dict.fromkeys(_SUMS, 0.0) | dict.fromkeys(_INTS, 0)
        pick = range(len(self._f)) if replicas is None else replicas
        for f, i in ((self._f[r], self._i[r]) for r in pick):
            for k, v in f.items():
                out[k] += v
            for k, v in i.items():
                out[k] += v
        # the keys of batchsim.sim.metrics.step_sums, which utilization reads
        out["op_time"] = out["compute_s"] + out["memory_s"]
        out["billed"] = float(out["prefill_tokens"] + out["decode_tokens"] + out["padding_tokens"])
        out["useful"] = float(out["prefill_tokens"] + out["decode_tokens"])
        out["mean_batch_size"] = out["num_seqs"] / out["steps"] if out["steps"] else 0.0
        out["max_end"] = self.max_end
        return out
