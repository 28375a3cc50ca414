"""Tables from summaries: the CSV frames and the report's sortable tables.

``summary.csv`` has a row per policy and the summary.json keys as columns;
with several seeds each numeric key holds the mean and is followed by
``<key>_ci95``, the 95% CI half-width, after a ``seeds`` column. CSV floats
are written with a fixed format (``batchsim.sim.io.write_csv``), so the same scenario
and seed give the same bytes.

A column with ``absent`` set is optional: it is shown only when some row has
its key (:func:`shown_columns`), and a row without the key shows ``absent``.
The prefix-cache hit rate is one (``prefix_cache_hit_rate`` is in a summary only
when the run had a prefix cache; docs/prefix-caching.md), so reports of runs
without prefix caching keep the columns they always had.
"""

from __future__ import annotations

import json
import math
from typing import Sequence

import pandas as pd

from batchsim.reports.runs import PolicyRun
from batchsim.reports.stats import CI_SUFFIX

__all__ = ["summary_frame", "runs_frame", "csv_frame", "rejection_rows", "Column", "LATENCY_COLUMNS",
           "UTILIZATION_COLUMNS", "SWEEP_COLUMNS", "REJECTION_COLUMNS", "PREFIX_CACHE_COLUMN", "format_cell",
           "table_rows", "shown_columns", "CSV_FLOAT_FORMAT"]

CSV_FLOAT_FORMAT = "%.9g"


def summary_frame(runs: Sequence[PolicyRun]) -> pd.DataFrame:
    """One row per policy: its summary (one seed) or its means and CIs (several); dict and
    list values (``rejected_by_reason``, ``warnings``) as JSON text (:func:`csv_frame`)."""
    rows = []
    for run in runs:
        # (provenance is a nested record: it is in each run's summary.json, not a column)
        stats = {k: v for k, v in run.stats().items() if k != "provenance"}
        if run.seeds > 1:
            stats = {"policy": stats.pop("policy", run.policy), "seeds": run.seeds, **stats}
        rows.append(stats)
    return csv_frame(pd.DataFrame(rows))


def csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with its dict and list cells (``rejected_by_reason``,
    ``warnings``) as JSON text, so a CSV reader can parse them back."""
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype == object and out[col].map(lambda v: isinstance(v, (dict, list, tuple))).any():
            out[col] = out[col].map(lambda v: json.dumps(v, ensure_ascii=False)
                                    if isinstance(v, (dict, list, tuple)) else v)
    return out


def rejection_rows(runs: Sequence[PolicyRun]) -> list[dict]:
    """A row per policy that rejected requests: how many, of how many measured, and by kind."""
    rows = []
    for run in runs:
        s = run.stats()
        if not s.get("rejected"):
            continue
        kinds = s.get("rejected_by_reason") or {}
        measured = s.get("measured_requests") or 0
        rows.append({"policy": run.policy, "rejected": s["rejected"], "measured_requests": measured,
                     "rejected_share": s["rejected"] / measured if measured else float("nan"),
                     "by_reason": ", ".join(f"{n:g} {k}" for k, n in kinds.items())})
    return rows


def runs_frame(runs: Sequence[PolicyRun]) -> pd.DataFrame:
    """One row per (policy, seed index): every run's own summary."""
    rows = [{"seed_index": i, **s} for run in runs for i, s in enumerate(run.summaries)]
    return csv_frame(pd.DataFrame(rows))


class Column:
    """A report-table column: a label with its unit, a key and a format; ``absent``
    (optional columns only) is what a row without the key shows."""

    __slots__ = ("label", "key", "kind", "absent")

    def __init__(self, label: str, key: str, kind: str, absent: str | None = None) -> None:
        self.label, self.key, self.kind, self.absent = label, key, kind, absent


def _has(row: dict, key: str) -> bool:
    """``row`` has a value for ``key`` (a frame's missing cell is NaN)."""
    v = row.get(key)
    return key in row and not (isinstance(v, float) and math.isnan(v))


def shown_columns(rows: Sequence[dict], columns: Sequence[Column]) -> list[Column]:
    """``columns`` without the optional ones (``absent`` set) that no row has."""
    return [c for c in columns if c.absent is None or any(_has(r, c.key) for r in rows)]


# Optional: only runs with a prefix cache have the key; "off" for the others.
PREFIX_CACHE_COLUMN = Column("prefix cache hit rate", "prefix_cache_hit_rate", "pct", absent="off")


# kind: "text", "int", "f0", "f1", "f2", "g" (4 significant digits), "pct" (a fraction shown as %).
LATENCY_COLUMNS: tuple[Column, ...] = (
    Column("policy", "policy", "text"),
    Column("completed", "completed", "int"),
    Column("rejected", "rejected", "int"),
    Column("unfinished", "unfinished", "int"),
    Column("requests/s", "request_throughput", "f2"),
    Column("output tok/s", "output_throughput", "f0"),
    Column("goodput (req/s in SLO)", "request_goodput", "f2"),
    Column("TTFT p50 (ms)", "median_ttft_ms", "f1"),
    Column("TTFT p99 (ms)", "p99_ttft_ms", "f1"),
    Column("TPOT p50 (ms)", "median_tpot_ms", "f1"),
    Column("TPOT p99 (ms)", "p99_tpot_ms", "f1"),
    Column("ITL p99 (ms)", "p99_itl_ms", "f1"),
    Column("ITL max (ms)", "max_itl_ms", "f1"),
    Column("E2E p50 (ms)", "median_e2el_ms", "f0"),
    Column("E2E p99 (ms)", "p99_e2el_ms", "f0"),
)

UTILIZATION_COLUMNS: tuple[Column, ...] = (
    Column("policy", "policy", "text"),
    Column("busy", "busy_fraction", "pct"),
    Column("MFU", "mfu", "pct"),
    Column("MBU", "mbu", "pct"),
    Column("compute-bound time", "compute_bound_fraction", "pct"),
    Column("token efficiency", "token_efficiency", "pct"),
    Column("mean batch", "mean_batch_size", "f1"),
    Column("peak KV", "peak_kv_usage", "pct"),
    PREFIX_CACHE_COLUMN,
    Column("preemptions", "preemptions", "f0"),
)

SWEEP_COLUMNS: tuple[Column, ...] = (
    Column("policy", "policy", "text"),
    Column("rate (req/s)", "rate", "f2"),
    Column("offered tok/s", "offered_output_throughput", "f0"),
    Column("served tok/s", "served_output_throughput", "f0"),
    Column("saturated", "saturated", "text"),
    Column("TTFT p50 (ms)", "median_ttft_ms", "f1"),
    Column("TTFT p99 (ms)", "p99_ttft_ms", "f1"),
    Column("TPOT p50 (ms)", "median_tpot_ms", "f1"),
    Column("TPOT p99 (ms)", "p99_tpot_ms", "f1"),
    Column("output tok/s", "output_throughput", "f0"),
    Column("goodput (req/s in SLO)", "request_goodput", "f2"),
    Column("completed", "completed", "int"),
    Column("rejected", "rejected", "int"),
    PREFIX_CACHE_COLUMN,
)


REJECTION_COLUMNS = (
    Column("policy", "policy", "text"),
    Column("rejected", "rejected", "int"),
    Column("measured requests", "measured_requests", "int"),
    Column("share rejected", "rejected_share", "pct"),
    Column("by reason", "by_reason", "text"),
)


def _fmt(value: float, kind: str) -> str:
    if kind == "pct":
        return f"{100.0 * value:.1f}%"
    if kind == "int":
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    if kind == "g":
        return f"{value:.4g}"
    return f"{value:.{int(kind[1])}f}"


def format_cell(row: dict, col: Column) -> tuple[str, str, str]:
    """``(shown value, "± half-width" or "", sort key)`` of one cell."""
    if col.absent is not None and not _has(row, col.key):
        return col.absent, "", ""
    value = row.get(col.key, "")
    if value is None:  # a null metric: no measured request has it
        return "—", "", ""
    if col.kind == "text" or not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value), "", str(value)
    if isinstance(value, float) and math.isnan(value):
        return "–", "", ""
    half = row.get(col.key + CI_SUFFIX)
    ci = ""
    if isinstance(half, float) and not math.isnan(half):
        ci = "± " + _fmt(half, "f1" if col.kind == "int" else col.kind)
    return _fmt(value, col.kind), ci, repr(float(value))


def table_rows(rows: Sequence[dict], columns: Sequence[Column]) -> list[list[tuple[str, str, str]]]:
    """Every row's formatted cells, in column order."""
    return [[format_cell(r, c) for c in columns] for r in rows]
