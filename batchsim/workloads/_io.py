"""Reading columns from CSV/JSONL files and validating them, with line numbers.

Every reader in :mod:`batchsim.workloads.traces` and the empirical length
distribution go through here, so that a bad file always produces the same
kind of :class:`~batchsim.sim.errors.InputError`: the file, the line (1-based, as a
text editor counts: a CSV header is line 1), the column, the bad value and
what was expected. Reading stays vectorized (pandas' C parser for CSV, one
``json.loads`` for a whole JSONL file); the slow per-row path runs only to
locate an error that the fast path detected.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path

import numpy as np

from batchsim.sim.errors import InputError

from .config import MAX_TOKENS

__all__ = ["Table", "resolve", "read_csv", "read_jsonl", "read_table", "tokens", "numbers", "times", "fail", "boolean"]


@dataclass
class Table:
    """Raw columns of a file plus the 1-based line number of every row."""

    path: Path
    columns: dict[str, np.ndarray]  # raw values (numeric or object)
    lines: np.ndarray  # int64 line numbers (or list indices when ``fields``)
    fields: bool = False  # rows are items of JSON lists: name them 'column[i]'

    def __len__(self) -> int:
        return len(self.lines)

    def take(self, idx: np.ndarray) -> "Table":
        """Rows ``idx`` (a boolean mask or integer index) of every column."""
        return Table(self.path, {k: v[idx] for k, v in self.columns.items()}, self.lines[idx], self.fields)

    def error(self, row: int, column: str, message: str) -> InputError:
        """An :class:`InputError` about ``column`` of row ``row`` (a position in this table)."""
        if self.fields:
            return InputError(message, f"{self.path}, field '{column}[{int(self.lines[row])}]'")
        return fail(self.path, int(self.lines[row]), column, message)


def fail(path: Path, line: int | None, column: str | None, message: str) -> InputError:
    """The one error shape: ``<file>, line <n>, column '<c>': <message>``."""
    where = str(path)
    if line is not None:
        where += f", line {line}"
    if column is not None:
        where += f", column '{column}'"
    return InputError(message, where)


def resolve(path: str | Path, base_dir: Path | None) -> Path:
    """``path`` resolved against the scenario folder; it must be an existing file."""
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    try:
        found, folder = p.is_file(), p.is_dir()
    except (OSError, ValueError):  # a name the OS refuses: a NUL byte, too long
        found = folder = False
    if folder:
        raise InputError(f"is a folder (resolved to {os.path.abspath(p)}); expected a trace file", str(path))
    if not found:
        raise InputError(f"file not found (resolved to {os.path.abspath(p)}); expected an existing trace file", str(path))
    return p


def _missing(path: Path, wanted: list[str], have: list[str], kind: str, line: int = 1) -> None:
    absent = [c for c in wanted if c not in have]
    if absent:
        owner = "the file has columns" if kind == "column" else "the object has keys"
        raise fail(path, line, absent[0], f"{kind} not found; {owner}: {', '.join(map(repr, have))}")


def read_csv(path: Path, columns: list[str], sep: str = ",") -> Table:
    """The named columns of a CSV with a header line; blank lines are skipped."""
    import pandas as pd  # (here, not at the top: a run without a trace never needs it)

    try:
        header = pd.read_csv(path, nrows=0, sep=sep)
    except pd.errors.EmptyDataError:
        raise fail(path, None, None, "file is empty; expected a header line and at least one row") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise fail(path, 1, None, f"cannot parse the header ({e}); expected a CSV header line") from None
    names = {str(c).strip(): c for c in header.columns}
    _missing(path, columns, list(names), "column")
    # NOTE: na_filter=False keeps the text of bad cells for the error message and
    # skip_blank_lines=False keeps row i on line i + 2; both cost nothing on clean files.
    # Every column is parsed (no usecols): with usecols pandas silently accepts rows with
    # extra fields, which is how an unquoted comma shifts a row's values unnoticed.
    # NOTE: pandas refuses a row with more fields than the header only after the first data
    # row: when the first one has them, index_col=False drops the extras with just a
    # ParserWarning (`1,000` read as 1 and 0). The warning is made an error here.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(path, sep=sep, na_filter=False, skip_blank_lines=False, low_memory=False,
                             index_col=False)
    except (pd.errors.ParserError, pd.errors.ParserWarning, UnicodeDecodeError, ValueError) as e:
        raise _ragged(path, sep, len(header.columns)) or fail(
            path, None, None, f"cannot parse the file ({str(e).strip()}); expected rows with one field per header column") from None
    cols = {c: df[names[c]].to_numpy() for c in columns}
    # NOTE: row i is line i + 2 only while no quoted field spans lines; traces have none.
    lines = np.arange(2, len(df) + 2, dtype=np.int64)
    blank = np.ones(len(df), dtype=bool)  # a blank line: every field of the row empty
    for name in df.columns:
        v = df[name].to_numpy()
        blank &= (v == "") if v.dtype == object or pd.api.types.is_string_dtype(v.dtype) else False
    table = Table(path, cols, lines)
    table = table.take(~blank) if blank.any() else table
    if len(table) == 0:
        raise fail(path, None, None, "no data rows after the header; expected at least one request")
    return table


def _ragged(path: Path, sep: str, width: int) -> InputError | None:
    """The first row with more fields than the header's ``width`` (the slow path, run only
    when pandas refused or warned about the file); None when there is none to name."""
    import csv

    if len(sep) != 1:  # (pandas reads a longer sep as a regular expression; csv cannot)
        return None
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        rows = csv.reader(f, delimiter=sep)
        for row in rows:
            if len(row) > width:
                return fail(path, rows.line_num, None,
                            f"{len(row)} fields where the header has {width}: {_short(sep.join(row))}; expected "
                            f"one field per header column (quote a value that holds {sep!r})")
    return None


def read_jsonl(path: Path, keys: list[str], int_list: str | None = None) -> Table:
    """The named keys of a JSON-lines file (one object per line); blank lines are skipped.

    ``int_list`` names an optional key holding a list of integers per row
    (Mooncake ``hash_ids``); its column holds tuples when present.
    """
    buf = path.read_bytes()
    if int_list is not None:
        fast = _read_jsonl_fast(path, buf, keys, int_list)
        if fast is not None:
            return fast
    raw = buf.split(b"\n")
    keep = [i for i, s in enumerate(raw) if s.strip()]
    rows = _parse_rows(path, raw, keep)
    _missing(path, keys, list(rows[0]), "key", keep[0] + 1)
    # (the key on any row, as the fast path sees it: on the first only, a row without it went unnoticed)
    names = [*keys, *([int_list] if int_list is not None and any(int_list in r for r in rows) else [])]
    cols = {k: _objects([r.get(k) for r in rows]) for k in names}
    return Table(path, cols, np.asarray(keep, dtype=np.int64) + 1)


def _parse_rows(path: Path, raw: list[bytes], keep: list[int]) -> list[dict]:
    if not keep:
        raise fail(path, None, None, "file is empty; expected one JSON object per line")
    try:
        rows = json.loads(b"[" + b",".join([raw[i] for i in keep]) + b"]")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        rows = None
    if rows is None or len(rows) != len(keep):
        _locate_json_error(path, raw, keep)
    for i, r in zip(keep, rows):
        if not isinstance(r, dict):
            raise fail(path, i + 1, None, f"{_short(raw[i])} is not a JSON object; expected one object per line")
    return rows


def _objects(values: list) -> np.ndarray:
    """A 1-D object array; list values (hash_ids) stay objects instead of making it 2-D."""
    try:
        out = np.array(values, dtype=object)
        if out.ndim == 1:
            return out
    except ValueError:
        pass
    return np.fromiter(values, dtype=object, count=len(values))


_SENTINEL = "@lifted-by-batchsim@"


def _read_jsonl_fast(path: Path, buf: bytes, keys: list[str], int_list: str) -> Table | None:
    """Parse ``int_list`` arrays with numpy instead of json; None = use the general path.

    NOTE: decoding millions of small ints through ``json`` dominates reading a
    large Mooncake trace (~10 s per 1M rows); lifting the arrays out with a
    regex and parsing them in one ``np.fromstring`` is ~3x faster. Anything
    unexpected (a nested list, a float, a count mismatch) falls back to the
    general path, which also produces the error messages.
    """
    pat = re.compile(rb'"' + re.escape(int_list.encode()) + rb'"\s*:\s*\[([^\]\n]*)\]')
    parts = pat.split(buf)  # text, list body, text, list body, ..., text
    groups = parts[1::2]
    if not groups:
        return None
    # per row: commas + 1, or 0 for an empty list (a blank-but-nonempty body then fails the count check)
    counts = np.fromiter(map(bytes.count, groups, repeat(b",")), dtype=np.int64, count=len(groups))
    counts += np.fromiter(map(len, groups), dtype=np.int64, count=len(groups)) > 0
    text = b",".join(filter(None, groups))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ints = np.fromstring(text.decode("ascii"), dtype=np.int64, sep=",") if text else np.zeros(0, np.int64)
    except (ValueError, DeprecationWarning, UnicodeDecodeError):
        return None
    big = np.iinfo(np.int64)
    if len(ints) != counts.sum() or (ints == big.max).any() or (ints == big.min).any():
        return None
    raw = (b'"' + int_list.encode() + b'":"' + _SENTINEL.encode() + b'"').join(parts[0::2]).split(b"\n")
    keep = np.flatnonzero(np.fromiter(map(len, raw), dtype=np.int64, count=len(raw)))
    try:
        rows = json.loads(b"[" + b",".join(filter(None, raw)) + b"]") if len(keep) else None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return None
    if rows is None or len(rows) != len(keep) or not all(isinstance(r, dict) for r in rows):
        return None
    _missing(path, keys, list(rows[0]), "key", int(keep[0]) + 1)
    cols = {k: _objects([r.get(k) for r in rows]) for k in [*keys, int_list]}
    slots = cols[int_list] == _SENTINEL
    if int(slots.sum()) != len(groups):
        return None
    flat, off = ints.tolist(), np.concatenate(([0], np.cumsum(counts))).tolist()
    cols[int_list][slots] = np.fromiter((tuple(flat[a:b]) for a, b in zip(off[:-1], off[1:])), dtype=object, count=len(groups))
    return Table(path, cols, np.asarray(keep, dtype=np.int64) + 1)


def _locate_json_error(path: Path, raw: list[bytes], keep: list[int]) -> None:
    for i in keep:
        try:
            obj = json.loads(raw[i])
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise fail(path, i + 1, None, f"not valid JSON ({getattr(e, 'msg', e)}): {_short(raw[i])}; expected one JSON object per line") from None
        except RecursionError:
            raise fail(path, i + 1, None, f"JSON nested too deeply: {_short(raw[i])}; expected one flat JSON object per line") from None
        if not isinstance(obj, dict):
            raise fail(path, i + 1, None, f"{_short(raw[i])} is not a JSON object; expected one object per line")
    raise fail(path, None, None, "cannot parse the file; expected one JSON object per line")


def read_table(path: Path, columns: list[str], fmt: str | None = None) -> Table:
    """CSV or JSONL by ``fmt``, or by suffix when ``fmt`` is None."""
    if fmt is None:
        fmt = "jsonl" if path.suffix.lower() in (".jsonl", ".json", ".ndjson") else "csv"
    return read_jsonl(path, columns) if fmt == "jsonl" else read_csv(path, columns)


def _short(v: object) -> str:
    s = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
    return repr(s if len(s) <= 60 else s[:57] + "...")


def _fmt(v: object) -> str:
    if isinstance(v, (float, np.floating)) and np.isfinite(v) and float(v).is_integer() and abs(v) < 1e16:
        return repr(str(int(v)))
    return _short(v)


def numbers(table: Table, column: str, expected: str, *, nonneg: bool = True) -> np.ndarray:
    """A column as float64; the first boolean, non-number, missing or negative value raises."""
    raw = table.columns[column]
    # NOTE: numpy reads True as 1.0: `"input_length": true` replayed a 1-token prompt (and a
    # CSV column of only true/false, which pandas parses as booleans, did the same).
    if raw.dtype == bool or (raw.dtype == object and not set(map(type, raw)).isdisjoint(_BOOLS)):
        i = next(i for i, v in enumerate(raw) if isinstance(v, _BOOLS))
        raise table.error(i, column, f"{boolean(raw[i])} is a boolean; expected {expected}")
    try:
        vals = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a JSON integer beyond float64
        _first_non_number(table, column, expected)
        raise
    bad = ~np.isfinite(vals)
    if bad.any():
        i = int(np.argmax(bad))
        what = "missing value" if np.isnan(vals[i]) else "infinite value"
        shown = "" if raw[i] is None else " " + _fmt(raw[i])
        raise table.error(i, column, f"{what}{shown}; expected {expected}")
    if nonneg and (vals < 0).any():
        i = int(np.argmax(vals < 0))
        raise table.error(i, column, f"negative value {_fmt(raw[i])}; expected {expected}")
    return vals


_BOOLS = (bool, np.bool_)


def boolean(v: object) -> str | None:
    """``'true'``/``'false'`` (quoted, as JSON spells them) when ``v`` is a boolean, else None."""
    return repr(str(bool(v)).lower()) if isinstance(v, _BOOLS) else None


def _first_non_number(table: Table, column: str, expected: str) -> None:
    """Raise for the first value ``float()`` rejects (the slow path, run only on bad files)."""
    for i, v in enumerate(table.columns[column]):
        try:
            float(v)
        except OverflowError:
            raise table.error(i, column, f"{_short(v)} is too large; expected {expected}") from None
        except (TypeError, ValueError):
            if isinstance(v, str) and not v.strip():
                raise table.error(i, column, f"missing value {v!r}; expected {expected}") from None
            raise table.error(i, column, f"{_fmt(v)} is not a number; expected {expected}") from None


def tokens(table: Table, column: str) -> np.ndarray:
    """A token-count column as int64 >= 0; fractions, negatives and gaps raise."""
    expected = "a whole number of tokens >= 0"
    vals = numbers(table, column, expected)
    frac = vals != np.floor(vals)
    if frac.any():
        i = int(np.argmax(frac))
        raise table.error(i, column, f"{_fmt(table.columns[column][i])} is not whole; expected {expected}")
    # NOTE: beyond int64 the cast wraps (1e30 became -2^63, then min_tokens): refuse instead.
    big = vals > MAX_TOKENS
    if big.any():
        i = int(np.argmax(big))
        raise table.error(i, column, f"{_fmt(table.columns[column][i])} is too large; expected {expected} "
                                     f"and at most {MAX_TOKENS}")
    return vals.astype(np.int64)


_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


def times(table: Table, column: str, unit: str) -> np.ndarray:
    """Arrival times in seconds. ``unit`` is s/ms/us/ns (the file's own origin) or
    'datetime': ISO 8601 timestamps (origin: the earliest one; a zone offset is
    honoured, a timestamp without one is taken as UTC)."""
    if unit != "datetime":
        # NOTE: divide, not multiply by 1e-3: division rounds correctly, so 250 ms is exactly 0.25 s.
        return numbers(table, column, f"a time in {unit} >= 0") / _PER_SECOND[unit]
    raw = table.columns[column]
    import pandas as pd

    parsed = pd.to_datetime(pd.Series(raw, dtype=object), format="ISO8601", errors="coerce", utc=True)
    bad = parsed.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise table.error(i, column, f"cannot parse timestamp {_short(raw[i])}; "
                                     "expected an ISO 8601 timestamp like '2023-11-16 18:17:03.9799600'")
    ns = parsed.dt.tz_localize(None).to_numpy(dtype="datetime64[ns]").astype(np.int64)
    if len(ns) == 0:
        return np.zeros(0)
    # NOTE: subtract in integer nanoseconds before going to float, so epoch-scale
    # timestamps keep sub-microsecond resolution.
    return (ns - ns.min()).astype(np.float64) / 1e9
