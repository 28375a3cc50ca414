"""Record sinks store every value as writing it row by row would.

Columns (the step rows' buffer) let appended rows wait and write them in blocks;
StepTotals does the same inside its fixed chunks; StepStream hands rows on in
their canonical order as they become final. Whatever the mix and order of
append / extend calls, the columns must hold exactly the row-by-row values,
the totals must be bit-identical to feeding each replica's records in one
block, and a stream's rows must be the whole run's rows sorted.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from batchsim.sim import aggregate
from batchsim.sim.aggregate import StepTotals
from batchsim.sim.records import STEP_FIELDS, AutoSteps, Columns, FrameSteps, StepStream, TimelineSteps

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
def test_step_columns_hold_the_row_by_row_values(seed):
    rng = np.random.default_rng(seed)
    ops = _ops(rng, 3, 3000, 40)
    log = Columns(STEP_FIELDS, capacity=16)
    _feed(log, ops, probe=lambda: rng.random() < 0.01)
    want = _row_by_row(ops)
    frame = log.frame()
    assert len(log) == len(want[0]) == len(frame)
    for (name, dt), a in zip(STEP_FIELDS, want):
        got = frame[name].to_numpy()
        assert got.dtype == np.dtype(dt) and got.tobytes() == a.tobytes(), name


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


def _in_place(stream, cols) -> None:
    """A block written as the core writes it: into the stream's own arrays (reserve, commit)."""
    k = len(cols[0])
    got = stream.reserve(k)
    if got is None:  # (appended rows wait)
        stream.extend(*cols)
        return
    n, arrays = got
    for a, c in zip(arrays, cols):
        a[n:n + k] = c
    stream.commit(k)


@pytest.mark.parametrize("mode", ["rows", "blocks", "in_place"])
@pytest.mark.parametrize("chunk", [1 << 18, 50])
@pytest.mark.parametrize("seed", range(3))
def test_step_stream_hands_on_the_rows_sorted_by_end_then_replica(seed, chunk, mode, monkeypatch):
    """Steps end on a clock that never goes back, on replicas in any order (equal ends happen).
    The Python engine appends each as it ends (``rows``); the core hands over each replica's
    rows in blocks now and then, then settles at its clock (``blocks``), writing them into the
    stream's own arrays (``in_place``: reserve, commit). The sink gets every row once, in (end,
    replica) order, each replica's equal-end rows in their own order, and the totals all of
    them, bit for bit the same as from blocks."""
    monkeypatch.setattr(StepStream, "CHUNK", chunk)
    rng = np.random.default_rng(seed)
    sink, totals = FrameSteps(), StepTotals(3)
    stream = StepStream(totals, sink)
    now, rows, held = 0.0, [], [[] for _ in range(3)]
    extra = STEP_FIELDS[3:]
    for _ in range(3000):
        now += float(rng.choice([0.0, 0.5, 1.0]))
        r = int(rng.integers(3))
        row = [r, now - 0.25, now] + [int(rng.integers(0, 9)) for _ in extra]
        rows.append(row)
        if mode == "rows":
            stream.append(*row)
        else:
            held[r].append(row)
            if rng.random() < 0.05:  # a flush: every replica's held rows, then the clock
                for rr in range(3):
                    if held[rr]:
                        (_in_place if mode == "in_place" else lambda st, c: st.extend(*c))(
                            stream, [np.array(c) for c in zip(*held[rr])])
                        held[rr] = []
                stream.settle(now)
    for rr in range(3):
        if held[rr]:
            (_in_place if mode == "in_place" else lambda st, c: st.extend(*c))(stream, [np.array(c) for c in zip(*held[rr])])
    stream.close()
    want = [np.array(c) for c in zip(*rows)]
    order = np.lexsort((want[0], want[2]))
    got = sink.frame()
    assert len(got) == len(order) == len(stream)
    for j, (name, dt) in enumerate(STEP_FIELDS):
        assert got[name].to_numpy().tolist() == want[j][order].astype(dt).tolist(), name
    assert totals.totals()["steps"] == len(order)
    if mode == "in_place":  # (the same totals as the same blocks given to extend)
        blocks = StepTotals(3)
        for rr in range(3):
            mine = [row for row in rows if row[0] == rr]
            if mine:
                blocks.extend(*[np.array(c).astype(dt) for c, (_, dt) in zip(zip(*mine), STEP_FIELDS)])
        assert totals.totals() == blocks.totals()


def test_columns_drop_front_keeps_the_rest_in_order():
    """drop_front moves the rows after the first k to the front of the same arrays, waiting
    (appended) rows included, and later rows go after them."""
    cols = Columns(STEP_FIELDS[:3], capacity=8)
    for i in range(5):
        cols.append(0, float(i), float(i) + 0.5)
    cols.extend(np.zeros(3, dtype=np.int32), np.arange(5.0, 8.0), np.arange(5.0, 8.0) + 0.5)
    cols.drop_front(6)
    cols.append(0, 8.0, 8.5)
    assert cols.column("start").tolist() == [6.0, 7.0, 8.0] and len(cols) == 3
    cols.drop_front(3)
    assert len(cols) == 0 and cols.column("end").tolist() == []


class _Inner:
    def __init__(self) -> None:
        self.chunks: list = []

    def write(self, chunk) -> None:
        self.chunks.append({f: np.array(a) for f, a in chunk.items()})

    def close(self, columns) -> None:
        pass


class _KeepingTimeline(TimelineSteps):
    keeps_chunks = True  # (the stream then gives it fresh arrays for every chunk, as before reuse)


@pytest.mark.parametrize("seed", range(3))
def test_step_stream_reuses_its_buffer_only_for_sinks_that_copy(seed, monkeypatch):
    """One replica's blocks through a timeline sink, which copies what it holds: the stream writes
    the next rows into the same arrays (no new memory per chunk), and the timeline is the one a
    sink given fresh arrays every time writes. A sink that may keep views (FrameSteps, AutoSteps
    while it holds rows) never gets reused arrays."""
    monkeypatch.setattr(StepStream, "CHUNK", 40)
    out = []
    for cls in (TimelineSteps, _KeepingTimeline):
        rng = np.random.default_rng(seed)
        inner = _Inner()
        stream = StepStream(StepTotals(1), cls(inner, 2.0))
        now = 0.0
        for _ in range(60):
            k = int(rng.integers(1, 30))
            end = now + np.cumsum(rng.choice([0.0, 0.25, 1.0], size=k))
            cols = [np.zeros(k, dtype=np.int32), end - 0.1, end] + [
                rng.integers(0, 9, k) for _ in STEP_FIELDS[3:]]
            stream.extend(*cols)
            now = float(end[-1])
            stream.settle(now)
        stream.close()
        out.append(inner.chunks)
    assert [sorted(c) for c in out[0]] == [sorted(c) for c in out[1]]
    for a, b in zip(*out):
        for f in a:
            assert a[f].tolist() == b[f].tolist(), f
    assert getattr(FrameSteps(), "keeps_chunks", True)
    auto = AutoSteps(FrameSteps, lambda: TimelineSteps(_Inner(), 1.0), limit=10)
    assert auto.keeps_chunks
    auto._decide("timeline")
    assert not auto.keeps_chunks


def test_a_parquet_writer_that_fails_raises_in_the_run_and_leaves_nothing(tmp_path, monkeypatch):
    """The writer thread's error reaches the thread that writes (at a later write or at close), and
    discard removes the temporary file: the run's thread never waits on a writer that has stopped."""
    pq = pytest.importorskip("pyarrow.parquet")
    from batchsim.sim.io import TableFile

    class Broken(pq.ParquetWriter):
        def write_table(self, *a, **k):
            raise OSError("disk full")

    monkeypatch.setattr(pq, "ParquetWriter", Broken)
    monkeypatch.setattr("batchsim.sim.io.ROW_GROUP", 4)
    f = TableFile(tmp_path / "steps.parquet", "parquet")
    with pytest.raises(OSError, match="disk full"):
        for i in range(50):  # (more chunks than may wait: a write after the failure raises it)
            f.write({"a": np.arange(8) + i})
        f.close()
    f.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_discarded_parquet_file_stops_its_writer(tmp_path):
    pytest.importorskip("pyarrow")
    from batchsim.sim.io import TableFile

    f = TableFile(tmp_path / "steps.parquet", "parquet")
    for i in range(5):
        f.write({"a": np.arange(1000) + i})
    writer = f._writer_h
    f.discard()
    assert writer.done and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="needs POSIX interval timers")
def test_ctrl_c_while_a_parquet_file_is_discarded_leaves_no_file_and_no_writer(tmp_path, monkeypatch):
    """Ctrl-C (an alarm's exception, twice, 2 ms apart) lands while discard() waits for a writer
    still opening its file or busy with a row group: the interrupt comes out once the writer is
    done, the writer writes nothing more, and neither its temporary file nor its thread is left
    (the writer opening its file after discard() removed it made it again)."""
    import _thread

    pq = pytest.importorskip("pyarrow.parquet")
    from batchsim.sim.io import TableFile
    from tests.engine_helpers import AlarmInterrupts, Interrupt, threads_back_to

    slow_open, slow_write = pq.ParquetWriter.__init__, pq.ParquetWriter.write_table

    def opening(self, *a, **k):  # (a writer still starting, as one importing pyarrow.parquet is)
        time.sleep(0.03)
        slow_open(self, *a, **k)

    def write_table(self, *a, **k):  # (a row group that takes 30 ms: the alarms land in the wait)
        time.sleep(0.03)
        return slow_write(self, *a, **k)

    monkeypatch.setattr(pq.ParquetWriter, "__init__", opening)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    monkeypatch.setattr("batchsim.sim.io.ROW_GROUP", 1000)
    before = _thread._count()
    interrupted = 0
    with AlarmInterrupts() as alarms:
        for i in range(6):
            folder = tmp_path / str(i)
            f = TableFile(folder / "steps.parquet", "parquet")
            for j in range(1 + 2 * (i % 2)):  # (one chunk: discarded while the writer opens its file)
                f.write({"a": np.arange(1000) + j})
            time.sleep(0.005)  # (the run goes on a moment: the writer has begun)
            alarms.arm(2)
            try:
                f.discard()
            except Interrupt:
                interrupted += 1
            finally:
                alarms.disarm()
            assert threads_back_to(before) and list(folder.iterdir()) == []
    assert interrupted >= 3
