"""Record sinks store every value as writing it row by row would.

Columns, StepLog and ItlLog let appended rows (and listed gaps) wait and write
them in blocks; StepTotals and ItlAggregate do the same inside their fixed
chunks. Whatever the mix and order of append / extend / list calls, the
columns must hold exactly the row-by-row values, and the aggregates must be
bit-identical to feeding each replica's records in one block.
"""

from __future__ import annotations

import numpy as np
import pytest

from batchsim.sim import aggregate
from batchsim.sim.aggregate import ItlAggregate, StepTotals
from batchsim.sim.records import STEP_FIELDS, Columns, ItlLog, StepLog

_DTYPES = [dt for _, dt in STEP_FIELDS]


def _value(rng, dt, replica=None):
    """A scalar of a random Python or numpy type that fits ``dt``."""
    if replica is not None:
        return replica
    kind = rng.integers(4)
    if dt == "f8":
        x = float(rng.lognormal(-3, 2))
        return [x, np.float64(x), int(x * 100), np.float32(x)][kind]
    x = int(rng.integers(0, 5000))
    return [x, np.int64(x), np.int32(x), float(x) + 0.75][kind]


def _column(rng, dt, k):
    kind = rng.integers(3)
    if dt == "f8":
        a = rng.lognormal(-3, 2, k)
        return [a, a.astype(np.float32), (a * 100).astype(np.int64)][kind]
    a = rng.integers(0, 5000, k)
    return [a, a.astype(np.int32), a + 0.25][kind]


def _ops(rng, replicas, rows, max_block):
    """Random append/extend calls of step records: (replica, kind, values, count)."""
    ops, done = [], 0
    while done < rows:
        r = int(rng.integers(replicas))
        if rng.random() < 0.6:
            ops.append((r, "append", [_value(rng, dt, r if j == 0 else None) for j, dt in enumerate(_DTYPES)], 1))
            done += 1
        else:
            k = int(rng.integers(1, max_block))
            cols = [r if j == 0 else (_column(rng, dt, k) if rng.random() < 0.6 else _value(rng, dt))
                    for j, dt in enumerate(_DTYPES)]
            ops.append((r, "extend", cols, k))
            done += k
    return ops


def _row_by_row(ops, replica=None):
    """Each field's values written one by one into arrays of its dtype."""
    rows = [[] for _ in _DTYPES]
    for r, kind, values, k in ops:
        if replica is not None and r != replica:
            continue
        for j, v in enumerate(values):
            rows[j] += [v[i] for i in range(k)] if isinstance(v, np.ndarray) else [v] * k
    out = []
    for dt, vals in zip(_DTYPES, rows):
        a = np.empty(len(vals), dtype=dt)
        for i, v in enumerate(vals):
            a[i] = v
        out.append(a)
    return out


def _feed(sink, ops, probe=None):
    for r, kind, values, k in ops:
        if kind == "append":
            sink.append(*values)
        else:
            sink.extend(*values, count=k)
        if probe is not None and probe():
            len(sink)
            sink.column("end")  # reading writes the waiting rows


@pytest.mark.parametrize("seed", range(6))
def test_step_log_holds_the_row_by_row_values(seed):
    rng = np.random.default_rng(seed)
    ops = _ops(rng, 3, 3000, 40)
    log = StepLog(capacity=16)
    _feed(log, ops, probe=lambda: rng.random() < 0.01)
    want = _row_by_row(ops)
    frame = log.frame()
    assert len(log) == len(want[0]) == len(frame)
    for (name, dt), a in zip(STEP_FIELDS, want):
        got = frame[name].to_numpy()
        assert got.dtype == np.dtype(dt) and got.tobytes() == a.tobytes(), name


@pytest.mark.parametrize("seed", range(6))
def test_itl_log_holds_the_gap_by_gap_values(seed):
    rng = np.random.default_rng(seed)
    log, rids, gaps = ItlLog(capacity=8), [], []
    for _ in range(600):
        k = int(rng.integers(0, 50))
        r = rng.integers(0, 10_000, k)
        g = rng.lognormal(-4, 1, k)
        kind = rng.integers(4)
        if kind == 0:
            log.extend(r, g)
        elif kind == 1:
            log.extend(r.tolist(), g.tolist())
        elif kind == 2 and k:
            log.append(int(r[0]), float(g[0]))
            r, g = r[:1], g[:1]
        else:
            log.extend(r.tolist(), g.astype(np.float32).tolist())
            g = g.astype(np.float32).astype(np.float64)
        rids += r.tolist()
        gaps += g.tolist()
        if rng.random() < 0.02:
            assert len(log) == len(rids) and log.column("gap").tolist() == gaps
    frame = log.frame()
    assert frame["rid"].tolist() == rids and frame["gap"].tolist() == gaps
    assert frame["rid"].dtype == np.int64 and frame["gap"].dtype == np.float64


def test_columns_append_converts_like_item_assignment():
    c = Columns((("i", "i4"), ("f", "f8")), capacity=2)
    for v in (3, np.int64(4), 5.9, True):
        c.append(v, v)
    c.extend(np.array([7, 8]), 1, count=2)
    c.append(9, 2.5)
    assert c.column("i").tolist() == [3, 4, 5, 1, 7, 8, 9]
    assert c.column("f").tolist() == [3.0, 4.0, 5.9, 1.0, 1.0, 1.0, 2.5]


@pytest.mark.parametrize("chunk", [4096, 64])
@pytest.mark.parametrize("seed", range(4))
def test_step_totals_are_blocking_independent(seed, chunk, monkeypatch):
    monkeypatch.setattr(aggregate, "STEP_CHUNK", chunk)
    rng = np.random.default_rng(seed)
    ops = _ops(rng, 3, 9000 if chunk == 4096 else 1500, 3 * chunk // 2)
    mixed = StepTotals(3)
    _feed(mixed, ops)
    whole = StepTotals(3)  # each replica's records as one block
    for r in range(3):
        cols = _row_by_row(ops, r)
        if len(cols[0]):
            whole.extend(*cols)
    assert len(mixed) == len(whole)
    assert mixed.totals() == whole.totals()


@pytest.mark.parametrize("mask", ["all", "run", "mod3"])
@pytest.mark.parametrize("chunk", [1 << 16, 100])
@pytest.mark.parametrize("seed", range(3))
def test_itl_aggregate_is_blocking_independent(seed, chunk, mask, monkeypatch):
    monkeypatch.setattr(aggregate, "ITL_CHUNK", chunk)
    monkeypatch.setattr(aggregate, "_WAITING_GAPS", 1 << 14 if chunk > 100 else 37, raising=False)
    rng = np.random.default_rng(seed)
    n_rids = 500
    measured = {"all": np.ones(n_rids, bool), "run": (np.arange(n_rids) >= 50) & (np.arange(n_rids) < 400),
                "mod3": np.arange(n_rids) % 3 != 0}[mask]
    mixed = ItlAggregate(2, measured)
    sinks = [mixed.sink(0), mixed.sink(1)]
    kept = [[], []]
    for _ in range(1500 if chunk > 100 else 300):
        r = int(rng.integers(2))
        k = int(rng.integers(1, 400 if rng.random() < 0.2 else 30))
        lo = int(rng.integers(0, n_rids - k)) if rng.random() < 0.5 else int(rng.integers(50, 400 - 30))
        rids = np.arange(lo, lo + k) % n_rids
        gaps = rng.lognormal(-4, 1.5, k)
        if rng.random() < 0.5:
            sinks[r].extend(rids.tolist(), gaps.tolist())
        else:
            sinks[r].extend(rids, gaps)
        kept[r].append(gaps[measured[rids]])
    whole = ItlAggregate(2, measured)
    for r in range(2):
        g = np.concatenate(kept[r])
        whole.sink(r).extend(np.full(len(g), 61), g)  # rid 61 is measured under every mask
    assert len(mixed) == len(whole)
    pct = (50, 90, 99, 99.9)
    assert mixed.stats("itl", pct) == whole.stats("itl", pct)
