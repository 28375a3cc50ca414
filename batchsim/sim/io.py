"""Atomic output writing: a temporary file in the same folder, then rename; a run's files as a set.

A run that is killed mid-write leaves either the old file or the new one,
never half a file, so finished results are never lost or corrupted; and
:func:`write_set` puts a run's files in place together, so an output folder
never holds some files of an old run beside others of a new one.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import queue
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from batchsim.sim.handover import Handover
from batchsim.sim.table import Table

__all__ = ["atomic_write_text", "atomic_write_bytes", "write_json", "write_csv", "csv_text", "write_parquet", "write_table",
           "TableFile", "write_set", "clean_orphans", "require_folder", "require_file", "write_files", "MANIFEST",
           "FORMATS"]

FORMATS = ("csv", "parquet")


def require_folder(path: str | os.PathLike | None, option: str, contents: str = "") -> None:
    """Refuse, before any work, an output ``path`` (given by ``option``) that is a file: write_set
    would only find out after the run (nothing is written then)."""
    if path is not None and Path(path).exists() and not Path(path).is_dir():
        from batchsim.sim.errors import InputError

        raise InputError(f"{path} is a file; expected a folder" + (f" for {contents}" if contents else ""), option)
def require_file(path: str | os.PathLike | None, option: str, contents: str = "") -> None:
    """Refuse, before any work, an output file ``path`` (given by ``option``) that cannot be written:
    a folder, or a place whose nearest existing parent is a file or not writable."""
    if path is None:
        return
    from batchsim.sim.errors import InputError

    p = Path(path)
    what = f" for {contents}" if contents else ""
    if p.is_dir():
        raise InputError(f"{path} is a folder; expected a file{what}", option)
    parent = p.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{parent} is a file; expected a folder to hold {path}{what}", option)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot write in {parent} (permission denied){what}", option)


def write_files(files: dict[str | Path, bytes]) -> None:
    """Write several files as one set: each is written to a temporary file beside it first, and
    only when all of them are written are they renamed into place (so a failure leaves every
    old file as it was, never some new files beside old ones)."""
    staged: list[tuple[str, Path]] = []
    mode = 0o666 & ~_umask()  # (mkstemp makes 0600 files: outputs get the usual umask-based mode)
    try:
        for path, data in files.items():
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
            staged.append((tmp, p))
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        for tmp, p in staged:
            os.replace(tmp, p)
    except BaseException:
        for tmp, _ in staged:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise


_FLOAT_FORMAT = "%.9g"  # (CSV: a fixed float format, so identical runs give identical bytes)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (creating parent folders)."""
    write_files({path: data})


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any) -> None:
    """Pretty, stable JSON (keys in insertion order, trailing newline)."""
    atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False, default=_default) + "\n")


def _default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def write_csv(path: str | Path, df) -> None:
    """CSV with a fixed float format, so identical runs give identical bytes (:func:`csv_text`)."""
    atomic_write_text(path, csv_text(df))


# NOTE: the one CSV writer, for pandas frames and batchsim.sim.table.Table alike, written to give
# the bytes pandas' ``to_csv(index=False, float_format="%.9g", lineterminator="\n")`` gave (what
# every earlier output file holds; tests/test_outputs.py compares the two): a float column's
# values through %.9g with NaN as an empty cell, an integer or boolean column's through str, an
# object column's as Python's csv module writes them with None and NaN empty, quoting minimal.
_CHUNK_ROWS = 1 << 16


def _missing(v) -> bool:
    return (v is None or (isinstance(v, (float, np.floating)) and math.isnan(v))
            or type(v).__name__ in ("NAType", "NaTType"))


def _cells(a: np.ndarray) -> list:
    kind = a.dtype.kind
    if kind == "f":
        return ["" if v != v else _FLOAT_FORMAT % v for v in a.tolist()]
    if kind in "iub":
        return a.astype(str).tolist()
    if kind in "OUS":
        return ["" if _missing(v) else v for v in a.tolist()]
    raise TypeError(f"cannot write a column of dtype {a.dtype} as CSV")


def _columns(table) -> list[tuple[str, np.ndarray]]:
    if isinstance(table, Table):
        return list(table.items())
    if isinstance(table, dict):
        return [(k, np.asarray(v)) for k, v in table.items()]
    return [(str(c), table.iloc[:, i].to_numpy()) for i, c in enumerate(table.columns)]  # (a pandas frame)


def csv_text(table, header: bool = True) -> str:
    """``table`` (a Table, a dict of columns or a pandas frame) as CSV text."""
    cols = _columns(table)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if header:
        w.writerow([name for name, _ in cols])
    n = len(cols[0][1]) if cols else 0
    for lo in range(0, n, _CHUNK_ROWS):
        w.writerows(zip(*(_cells(a[lo:lo + _CHUNK_ROWS]) for _, a in cols)))
    return buf.getvalue()


def _arrow_table(chunk):
    import pyarrow as pa

    if isinstance(chunk, dict):
        return pa.table(chunk)  # (a stream's numeric columns: no copy)
    # NOTE: records (a Table, or a pandas frame, converted to one) go in column by column with
    # pandas' null semantics (NaN and None as null, as pa.Table.from_pandas read them), so a run's
    # records and the frame RunResult.requests makes of them write the same bytes; no pandas
    # schema metadata: pandas, polars and duckdb read the table alike
    cols = chunk if isinstance(chunk, Table) else Table.from_pandas(chunk)
    return pa.table({k: pa.array(a, from_pandas=True) for k, a in cols.items()})


# NOTE: Parquet with zstd and no dictionary pages: dictionary encoding of float columns whose
# values rarely repeat costs half the write time and saves little (27M step rows: 1.1 GB zstd
# with dictionaries in 20 s, without in ~5 s at a similar size).
_PARQUET = {"compression": "zstd", "use_dictionary": False, "write_statistics": True}
ROW_GROUP = 1 << 18  # rows per Parquet row group
_DEPTH = 2  # tables handed to the Parquet writer that may wait at once


def write_parquet(path: str | Path, df) -> None:
    """Parquet (pyarrow, zstd; nothing in the file depends on the time, so identical runs give
    identical bytes), written atomically."""
    t = TableFile(path, "parquet")
    try:
        t.write(df)
    except BaseException:
        t.discard()
        raise
    t.close()


def write_table(path: str | Path, df, fmt: str) -> None:
    """``df`` as ``fmt`` (one of :data:`FORMATS`)."""
    (write_parquet if fmt == "parquet" else write_csv)(path, df)


def _head(chunk):
    """``chunk``'s columns with no rows."""
    if isinstance(chunk, dict):
        return {k: np.asarray(v)[:0] for k, v in chunk.items()}
    return chunk.head(0) if isinstance(chunk, Table) else chunk.iloc[:0]


class TableFile:
    """A table written a chunk at a time (``write(frame or dict of columns)``), to a temporary
    file beside ``path`` that :meth:`close` renames into place (:meth:`discard` removes it):
    CSV as :func:`write_csv` writes it, or Parquet one row group per chunk. Parquet chunks are
    encoded and written by a thread (pyarrow releases the GIL), so a run that streams its
    records here overlaps the writing with the simulation; at most two chunks wait."""

    def __init__(self, path: str | Path, fmt: str) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
        self.path, self.fmt = Path(path), fmt
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # (a name that is already a temporary one, ``.out.tmp-PID-...``, keeps its form, so
        # clean_orphans knows whose it is when a killed run leaves it)
        name = self.path.name
        fd, tmp = tempfile.mkstemp(prefix=f"{name}." if name.startswith(".") else f".{name}.", suffix=".tmp",
                                   dir=self.path.parent)
        os.close(fd)
        self._tmp = Path(tmp)
        self._out = None
        # NOTE: the run's thread waits only in SimpleQueue.get (a lock acquired in C, which an
        # interrupt leaves cleanly; a Queue's Condition.wait can be left with its lock released
        # twice): tables go to the writer on _queue, and the writer hands back a slot on _slots for
        # each it takes, so at most _DEPTH wait.
        self._queue: queue.SimpleQueue | None = None
        self._slots: queue.SimpleQueue | None = None
        # (the writer's start and stop, right wherever an interrupt lands: a writer discard() saw
        # not begun writes nothing, and one it saw begun is waited for until done)
        self._writer_h: Handover | None = None
        self._error: BaseException | None = None
        self.rows = 0

    def write(self, chunk) -> None:
        n = len(next(iter(chunk.values()), ())) if isinstance(chunk, dict) else len(chunk)
        if self.fmt == "csv":
            if self._out is None:
                self._out = open(self._tmp, "w", encoding="utf-8", newline="")
                self._out.write(csv_text(_head(chunk)))
            if n:
                self._out.write(csv_text(chunk, header=False))
        else:
            table = _arrow_table(chunk)
            if self._writer_h is None:
                self._queue, self._slots = queue.SimpleQueue(), queue.SimpleQueue()
                for _ in range(_DEPTH):
                    self._slots.put(None)
                h = self._writer_h = Handover()  # (before the launch: discard() must know a writer may run)
                h.start(self._writer, h, table.schema)
            self._put(table)
        self.rows += n

    def _put(self, item) -> None:
        while True:
            if self._error is not None:
                raise self._error
            try:
                self._slots.get(timeout=0.5)
                break
            except queue.Empty:
                continue
        self._queue.put(item)

    def _writer(self, h: Handover, schema) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            if h.stop:  # (discarded while it started: it makes no file)
                return
            with pq.ParquetWriter(self._tmp, schema, **_PARQUET) as w:
                # (row groups of ROW_GROUP rows whatever the chunks: the file's bytes depend on its
                # rows only, not on how the run handed them over)
                held, n = [], 0
                while True:
                    try:  # (polled: a discard() an interrupt cut short still stops it)
                        table = self._queue.get(timeout=0.1)
                    except queue.Empty:
                        if h.stop:
                            return
                        continue
                    if h.stop:  # (discarded: nothing more is written)
                        return
                    self._slots.put(None)
                    if table is not None:
                        held.append(table)
                        n += table.num_rows
                    while n >= ROW_GROUP or (table is None and n):
                        whole = pa.concat_tables(held)
                        take = min(ROW_GROUP, n)
                        w.write_table(whole.slice(0, take), row_group_size=ROW_GROUP)
                        held, n = [whole.slice(take)], n - take
                    if table is None:
                        return
        except BaseException as e:  # (handed to the writing thread at its next write or close,
            self._error = e          # which sees it within _put's 0.5 s wait for a slot)
        finally:
            if h.stop:  # (discarded: the file is removed here too, on this thread, where no interrupt
                self._tmp.unlink(missing_ok=True)  # lands, however discard() itself ended)

    def _join(self) -> None:
        if self._writer_h is not None:
            if self._error is None:
                self._put(None)
            self._writer_h.wait(0.001)
            self._writer_h = None
            if self._error is not None:
                raise self._error

    def close(self, columns=None) -> Path:
        """Finish the file (``columns``: a table, frame or dict of columns that gives the columns
        when nothing was written) and put it in place."""
        if self._out is None and self._writer_h is None and columns is not None:
            self.write(_head(columns))
        self._join()
        if self._out is not None:
            self._out.close()
        os.chmod(self._tmp, 0o666 & ~_umask())
        os.replace(self._tmp, self.path)
        return self.path

    def discard(self) -> None:
        h = self._writer_h
        pending = None
        try:
            if h is not None:
                h.stop = True  # (a store: the writer writes nothing more and removes its file itself)
                while True:  # (an interrupt meanwhile is raised once the writer is done)
                    try:
                        if h.halt():  # (one not begun writes nothing)
                            self._queue.put(None)  # (wakes it now rather than at its next poll)
                            h.wait(0.001)
                        break
                    except BaseException as e:
                        pending = pending or e
                self._writer_h = None
            if self._out is not None:
                self._out.close()
        finally:
            self._tmp.unlink(missing_ok=True)
        if pending is not None:
            raise pending


# -- a run's outputs as one set ----------------------------------------------------------------
MANIFEST = "manifest.json"
_ORPHAN = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)-[^/]*$")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def clean_orphans(parent: Path, name: str) -> list[Path]:
    """Remove what a killed writer of ``parent/name`` left: its temporary and old folders
    (``.name.tmp-PID-*``, ``.name.old-PID-*``) whose process is gone. Returns what was removed."""
    removed = []
    if not parent.is_dir():
        return removed
    for p in sorted(parent.iterdir()):
        m = _ORPHAN.match(p.name)
        if m and m.group("name") == name and not _alive(int(m.group("pid"))):
            if p.is_dir() and not p.is_symlink():
                _carry_back(p, parent / name)  # a folder write_set was carrying across the swap (points/)
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed


# what a run wrote before sets had a manifest (batchsim before its ninth session)
_KNOWN = frozenset({"summary.json", "requests.csv", "steps.csv"})


def _previous_set(out: Path) -> set[str] | None:
    """The files of the set batchsim last wrote into ``out``: its manifest's, else the known
    output names present (None when there are none)."""
    try:
        data = json.loads((out / MANIFEST).read_text())
        return set(data["files"])
    except (OSError, ValueError, KeyError, TypeError):
        found = {n for n in _KNOWN if (out / n).exists()}
        return found or None


def write_set(out_dir: str | Path, writers: dict[str, Callable[[Path], None]], about: dict | None = None,
              keep: tuple[str, ...] = ("points",)) -> Path:
    """Write a run's output files as one set: never a mix of an old run's files and a new one's.

    The files are written into a temporary folder beside ``out_dir``, with ``manifest.json``
    (what the set holds) last, then put in place: when ``out_dir`` is absent, or holds only a set
    batchsim wrote before, the folders are swapped by rename; a folder that holds other files
    (``--out .``) keeps them, gets the new files renamed in and the previous set's other files
    removed, and its manifest last, so a set without its manifest is known to be incomplete.
    A killed writer's leftovers are removed by the next write to the same place.

    ``keep``: folders batchsim keeps in ``out_dir`` beside the set (``points/``, the finished
    runs a rerun resumes from). They do not stop the swap: they are moved into the new folder
    just before it, and :func:`clean_orphans` moves them back out of a killed writer's
    temporary folder, so they are never lost.
    """
    out = Path(out_dir).absolute()
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    clean_orphans(parent, out.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=parent))
    try:
        for name, write in writers.items():
            write(tmp / name)
        files = {name: (tmp / name).stat().st_size for name in writers}
        write_json(tmp / MANIFEST, {**(about or {}), "files": files})
        os.chmod(tmp, 0o777 & ~_umask())
        previous = _previous_set(out) if out.is_dir() else None
        if not out.exists():
            os.rename(tmp, out)
        elif (previous is not None and out != Path.cwd().absolute()
              and {p.name for p in out.iterdir()} <= previous | {MANIFEST} | set(keep)):
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=parent))
            os.rmdir(old)
            for name in keep:
                if (out / name).is_dir() and name not in writers:
                    os.rename(out / name, tmp / name)
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            if not out.is_dir():
                raise FileExistsError(f"{out} is not a folder")
            (out / MANIFEST).unlink(missing_ok=True)
            for name in writers:
                os.replace(tmp / name, out / name)
            for stale in (previous or set()) - set(writers):
                (out / stale).unlink(missing_ok=True)
            os.replace(tmp / MANIFEST, out / MANIFEST)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        _carry_back(tmp, out)  # (a kept folder already moved in goes back before the temp folder goes)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _carry_back(tmp: Path, out: Path) -> None:
    """Move the folders in ``tmp`` (only kept ones, such as points/, are folders there) back
    into ``out`` where it lacks them; ``out`` is made if a swap removed it."""
    if not tmp.is_dir():
        return
    for sub in sorted(tmp.iterdir()):
        if sub.is_dir() and not sub.is_symlink() and not (out / sub.name).exists():
            out.mkdir(exist_ok=True)
            os.rename(sub, out / sub.name)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask
