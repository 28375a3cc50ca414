"""A table of named numpy columns: the records' form from the engines to the files.

A run's request records go from the engine through the summary to requests.csv as
numpy columns; pandas is imported only where a frame is asked for
(:meth:`Table.to_pandas`: ``RunResult.requests``, the reports), so ``batchsim run``
does not pay pandas' import (about 0.2 s of a 0.7 s run of 100 requests; issue 23). A
:class:`Table` reads like the part of a frame the run's code uses: ``t["col"]`` is the
column's array, ``t[mask]`` / ``t[index]`` the rows, ``len(t)`` the row count, and
``t["col"] = values`` sets a column. :func:`column` reads a column of either a Table or a
pandas frame as an array, so code written with it takes both.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

__all__ = ["Table", "column", "as_table"]


class Table:
    """Equal-length numpy columns, in order."""

    __slots__ = ("_cols", "_n")

    def __init__(self, columns: Mapping[str, Any], n: int | None = None) -> None:
        cols: dict[str, np.ndarray] = {}
        for name, values in columns.items():
            cols[name] = np.asarray(values)
        lengths = {len(a) for a in cols.values() if a.ndim}
        if n is None:
            n = lengths.pop() if lengths else 0
        if lengths - {n}:
            raise ValueError(f"columns of unequal lengths: { {k: len(a) for k, a in cols.items()} }")
        self._cols, self._n = {name: _filled(a, n) for name, a in cols.items()}, n

    @property
    def columns(self) -> list[str]:
        return list(self._cols)

    def __len__(self) -> int:
        return self._n

    def __contains__(self, name: str) -> bool:
        return name in self._cols

    def __getitem__(self, key):
        if isinstance(key, str):
            return self._cols[key]
        key = np.asarray(key)
        return Table({k: a[key] for k, a in self._cols.items()}, n=int(key.sum()) if key.dtype == bool else len(key))

    def __setitem__(self, name: str, values) -> None:
        a = _filled(np.asarray(values), self._n)
        if len(a) != self._n:
            raise ValueError(f"column {name!r} has {len(a)} values for {self._n} rows")
        self._cols[name] = a

    def copy(self) -> "Table":
        return Table({k: a.copy() for k, a in self._cols.items()}, n=self._n)

    def items(self) -> Iterable[tuple[str, np.ndarray]]:
        return self._cols.items()

    def select(self, names: Iterable[str]) -> "Table":
        """The named columns, in that order."""
        return Table({k: self._cols[k] for k in names}, n=self._n)

    def head(self, n: int) -> "Table":
        return Table({k: a[:n] for k, a in self._cols.items()}, n=min(n, self._n))

    @staticmethod
    def concat(tables: "list[Table]") -> "Table":
        """The rows of ``tables`` (the same columns) one after another, with numpy's type promotion."""
        names = tables[0].columns
        return Table({k: np.concatenate([t[k] for t in tables]) for k in names}, n=sum(len(t) for t in tables))

    def sort_by(self, name: str) -> "Table":
        """The rows in ``name`` order (stable)."""
        return self[np.argsort(self._cols[name], kind="stable")]

    def to_pandas(self):
        """A pandas frame of the same columns (the frame ``pd.DataFrame(dict of arrays)`` makes)."""
        import pandas as pd

        return pd.DataFrame(dict(self._cols)) if self._cols else pd.DataFrame(index=range(self._n))

    @classmethod
    def from_pandas(cls, df) -> "Table":
        names = [str(c) for c in df.columns]
        if len(set(names)) < len(names):
            twice = sorted({c for c in names if names.count(c) > 1})
            raise ValueError(f"records with repeated column names ({', '.join(twice)}): each column needs its own name")
        return cls({name: df.iloc[:, i].to_numpy() for i, name in enumerate(names)}, n=len(df))


def _filled(a: np.ndarray, n: int) -> np.ndarray:
    """A column: ``a``, or the scalar ``a`` repeated ``n`` times (as a frame fills a scalar)."""
    return a if a.ndim else np.full(n, a[()], dtype=a.dtype)


def column(table, name: str, dtype=None) -> np.ndarray:
    """A column of a :class:`Table` or a pandas frame, as a numpy array (``dtype``: converted)."""
    values = table[name]
    if not isinstance(values, np.ndarray):
        values = values.to_numpy()
    return values if dtype is None else values.astype(dtype, copy=False)


def as_table(records) -> Table:
    """``records`` as a :class:`Table` (a pandas frame converted; a Table as it is)."""
    return records if isinstance(records, Table) else Table.from_pandas(records)
