"""Bounded-memory records for very large runs (``measure.records: aggregate``).

A full run keeps one row per step and one per inter-token gap: about 16
bytes per generated token, 7 GB for a million ShareGPT-like requests. With
``aggregate`` records the engine writes into these sinks instead, which keep
running totals and a histogram, so memory no longer grows with the run:

- :class:`StepTotals` keeps the sums the summary's utilization figures need
  (busy time, tokens, FLOPs, bytes, ...).
- :class:`ItlAggregate` keeps the count, sum and sum of squares of the
  measured requests' gaps and a log-spaced histogram (bins 0.1% wide), from
  which ITL percentiles are read to within 0.05%.

Determinism: each replica's records are reduced in fixed chunks of its own
steps (and of its own gaps), then chunk sums are added in order and replicas
in index order. A fast-forwarded run appends the same records in the same
per-replica order as step by step, only in blocks, and blocks are split at
chunk boundaries, so every total is bit-identical with fast-forward on or off
and across replica interleavings.

What differs from full records: no steps.csv and no per-gap frame (reports
that plot ITL distributions need full records), and a request counts for ITL
by its arrival in the measurement window, so with a horizon the gaps of
requests still running when it cuts the run are included (full records keep
completed requests only).
"""

from __future__ import annotations

import math

import numpy as np

from sim.records import STEP_FIELDS, Columns

__all__ = ["StepTotals", "ItlAggregate", "STEP_CHUNK", "ITL_CHUNK"]

STEP_CHUNK = 4096
ITL_CHUNK = 1 << 16
_ITL_G0 = 1e-7  # gaps at or below 0.1 us share the first bin
_ITL_WIDTH = math.log1p(1e-3)  # each bin is 0.1% wider than the last

_SUMS = ("busy", "compute_s", "memory_s", "useful_flops", "bytes")
_INTS = ("prefill_tokens", "decode_tokens", "padding_tokens", "num_seqs", "out_of_range", "steps")


class _Chunked:
    """Per-replica fixed-size chunks; subclasses reduce a full chunk."""

    def __init__(self, replicas: int, fields, chunk: int) -> None:
        self._chunk = chunk
        self._bufs = [Columns(fields, chunk) for _ in range(replicas)]

    def _add(self, replica: int, columns, count: int) -> None:
        buf, chunk = self._bufs[replica], self._chunk
        done = 0
        while done < count:
            take = min(count - done, chunk - len(buf))
            part = [c[done:done + take] if isinstance(c, np.ndarray) else c for c in columns]
            buf.extend(*part, count=take)
            done += take
            if len(buf) == chunk:
                self._reduce(replica, buf)
                buf._n = 0

    def _flush(self) -> None:
        for i, buf in enumerate(self._bufs):
            if len(buf):
                self._reduce(i, buf)
                buf._n = 0

    def _reduce(self, replica: int, buf: Columns) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class StepTotals(_Chunked):
    """Running sums of the step records (the ``StepLog`` interface: append, extend)."""

    def __init__(self, replicas: int) -> None:
        super().__init__(replicas, STEP_FIELDS, STEP_CHUNK)
        self._f = [dict.fromkeys(_SUMS, 0.0) for _ in range(replicas)]
        self._i = [dict.fromkeys(_INTS, 0) for _ in range(replicas)]
        self.max_end = -math.inf
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, *values) -> None:
        self._count += 1
        buf = self._bufs[values[0]]
        buf.append(*values)
        if len(buf) == self._chunk:
            self._reduce(values[0], buf)
            buf._n = 0

    def extend(self, *columns, count: int | None = None) -> None:
        k = len(columns[0]) if count is None else count
        if not k:
            return
        self._count += k
        replica = columns[0]
        replica = int(replica[0]) if isinstance(replica, np.ndarray) else int(replica)
        self._add(replica, columns, k)

    def _reduce(self, replica: int, buf: Columns) -> None:
        col = buf.column
        end = col("end")
        f, i = self._f[replica], self._i[replica]
        f["busy"] += float((end - col("start")).sum())
        for name in _SUMS[1:]:
            f[name] += float(col(name).sum())
        for name in _INTS[:-1]:
            i[name] += int(col(name).sum())
        i["steps"] += len(buf)
        self.max_end = max(self.max_end, float(end.max()))

    def totals(self) -> dict:
        """Sums over every replica (replicas in index order)."""
        self._flush()
        out: dict = dict.fromkeys(_SUMS, 0.0) | dict.fromkeys(_INTS, 0)
        for f, i in zip(self._f, self._i):
            for k, v in f.items():
                out[k] += v
            for k, v in i.items():
                out[k] += v
        # the keys of sim.metrics.step_sums, which utilization reads
        out["op_time"] = out["compute_s"] + out["memory_s"]
        out["billed"] = float(out["prefill_tokens"] + out["decode_tokens"] + out["padding_tokens"])
        out["useful"] = float(out["prefill_tokens"] + out["decode_tokens"])
        out["mean_batch_size"] = out["num_seqs"] / out["steps"] if out["steps"] else 0.0
        out["max_end"] = self.max_end
        return out


class _ItlSink:
    """What one replica's engine writes gaps into (``ItlLog``'s ``extend``)."""

    __slots__ = ("_agg", "_replica")

    def __init__(self, agg: "ItlAggregate", replica: int) -> None:
        self._agg, self._replica = agg, replica

    def extend(self, rids, gaps) -> None:
        self._agg._gaps(self._replica, rids, gaps)


class ItlAggregate(_Chunked):
    """Count, sums and a log histogram of the measured requests' inter-token gaps."""

    def __init__(self, replicas: int, measured: np.ndarray) -> None:
        super().__init__(replicas, (("gap", "f8"),), ITL_CHUNK)
        self._measured = measured
        self._sum = [0.0] * replicas
        self._sq = [0.0] * replicas
        self._n = [0] * replicas
        self._hist = np.zeros(1 << 15, dtype=np.int64)

    def sink(self, replica: int) -> _ItlSink:
        return _ItlSink(self, replica)

    def __len__(self) -> int:
        return sum(self._n) + sum(len(b) for b in self._bufs)

    def _gaps(self, replica: int, rids, gaps) -> None:
        rids = np.asarray(rids, dtype=np.int64)
        gaps = np.asarray(gaps, dtype=np.float64)
        keep = self._measured[rids]
        if not keep.all():
            gaps = gaps[keep]
        if len(gaps):
            self._add(replica, (gaps,), len(gaps))

    def _reduce(self, replica: int, buf: Columns) -> None:
        g = buf.column("gap")
        self._sum[replica] += float(g.sum())
        self._sq[replica] += float((g * g).sum())
        self._n[replica] += len(g)
        b = self._bin(g)
        top = int(b.max()) + 1
        if top > len(self._hist):
            self._hist = np.concatenate((self._hist, np.zeros(top - len(self._hist), dtype=np.int64)))
        self._hist[:top] += np.bincount(b, minlength=top)

    @staticmethod
    def _bin(g: np.ndarray) -> np.ndarray:
        return np.floor(np.log(np.maximum(g, _ITL_G0) / _ITL_G0) / _ITL_WIDTH).astype(np.int64)

    def stats(self, prefix: str, percentiles) -> dict[str, float]:
        """``mean_/std_/median_/pNN_{prefix}_ms`` as :func:`sim.metrics._stats` names them."""
        self._flush()
        n = sum(self._n)
        out = {f"mean_{prefix}_ms": 0.0, f"std_{prefix}_ms": 0.0}
        if not n:
            out.update({("median" if p == 50 else f"p{p}") + f"_{prefix}_ms": 0.0 for p in percentiles})
            return out
        total = sq = 0.0
        for s, q in zip(self._sum, self._sq):
            total += s
            sq += q
        mean = total / n
        out[f"mean_{prefix}_ms"] = mean * 1000.0
        out[f"std_{prefix}_ms"] = math.sqrt(max(sq / n - mean * mean, 0.0)) * 1000.0
        cum = np.cumsum(self._hist)
        for p in percentiles:
            rank = p / 100.0 * (n - 1)  # numpy's default (linear) percentile
            lo, hi = math.floor(rank), math.ceil(rank)
            v_lo, v_hi = self._value(cum, lo), self._value(cum, hi)
            key = "median" if p == 50 else f"p{p}"
            out[f"{key}_{prefix}_ms"] = (v_lo + (v_hi - v_lo) * (rank - lo)) * 1000.0
        return out

    @staticmethod
    def _value(cum: np.ndarray, index: int) -> float:
        """The gap at sorted position ``index``: its bin's geometric centre."""
        b = int(np.searchsorted(cum, index, "right"))
        return _ITL_G0 * math.exp((b + 0.5) * _ITL_WIDTH)
