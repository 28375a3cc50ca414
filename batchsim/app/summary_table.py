"""Render summary dicts as a rich table: one column per run, one row per metric.

A null latency (no measured request has it) shows as "—"; each run's
``warnings`` are printed once under the table, prefixed by its policy.

The prefix-cache hit rate (:data:`PREFIX_ROW`) is a row only when a shown run
had a prefix cache (its summary has ``prefix_cache_hit_rate``); there, a run
without one (caching off, or static / dynamic, which have none) shows "off".
Runs without prefix caching, the default, keep the table they always had.
"""

from __future__ import annotations

from rich.table import Table

__all__ = ["summary_table", "warning_lines", "table_rows", "TABLE_ROWS", "PREFIX_ROW", "NULL", "OFF"]

# (label, key, format) shown by `batchsim run` and `compare`.
TABLE_ROWS: tuple[tuple[str, str, str], ...] = (
    ("completed / rejected / unfinished", "", ""),
    ("request throughput (req/s)", "request_throughput", "{:.2f}"),
    ("output throughput (tok/s)", "output_throughput", "{:.0f}"),
    ("goodput (req/s meeting SLO)", "request_goodput", "{:.2f}"),
    ("TTFT p50 / p99 (ms)", "ttft", ""),
    ("TPOT p50 / p99 (ms)", "tpot", ""),
    ("ITL p50 / p99 / max (ms)", "itl", ""),
    ("E2E p50 / p99 (ms)", "e2el", ""),
    ("busy fraction", "busy_fraction", "{:.1%}"),
    ("MFU / MBU", "", ""),
    ("token efficiency", "token_efficiency", "{:.1%}"),
    ("mean batch size", "mean_batch_size", "{:.1f}"),
    ("peak KV usage", "peak_kv_usage", "{:.1%}"),
    ("preemptions", "preemptions", "{}"),
    ("engine", "engine", ""),
)

# Shown after "peak KV usage" when a run had a prefix cache (docs/prefix-caching.md).
PREFIX_ROW: tuple[str, str, str] = ("prefix cache hit rate", "prefix_cache_hit_rate", "{:.1%}")


NULL = "—"
OFF = "off"  # no prefix cache in this run


def _ms(v) -> str:
    return NULL if v is None else f"{v:.1f}"


def _cell(s: dict, label: str, key: str, fmt: str) -> str:
    if label.startswith("completed"):
        return f"{s['completed']} / {s['rejected']} / {s['unfinished']}"
    if label.startswith("MFU"):
        return f"{s['mfu']:.1%} / {s['mbu']:.1%}"
    if key == "itl":
        return f"{_ms(s['median_itl_ms'])} / {_ms(s['p99_itl_ms'])} / {_ms(s['max_itl_ms'])}"
    if key == "engine":
        return str(s.get("engine", "?"))
    if key == PREFIX_ROW[1] and key not in s:
        return OFF
    if key in ("ttft", "tpot", "e2el"):
        return f"{_ms(s[f'median_{key}_ms'])} / {_ms(s[f'p99_{key}_ms'])}"
    return NULL if s[key] is None else fmt.format(s[key])


def table_rows(summaries: list[dict]) -> tuple[tuple[str, str, str], ...]:
    """:data:`TABLE_ROWS`, with :data:`PREFIX_ROW` after "peak KV usage" when any
    summary had a prefix cache."""
    if not any(PREFIX_ROW[1] in s for s in summaries):
        return TABLE_ROWS
    at = next(i for i, row in enumerate(TABLE_ROWS) if row[1] == "peak_kv_usage") + 1
    return TABLE_ROWS[:at] + (PREFIX_ROW,) + TABLE_ROWS[at:]


def summary_table(summaries: list[dict], title: str | None = None) -> Table:
    """A metrics x runs table (columns labelled by policy)."""
    t = Table(title=title)
    t.add_column("metric")
    for s in summaries:
        t.add_column(str(s.get("policy", "")), justify="right")
    for label, key, fmt in table_rows(summaries):
        t.add_row(label, *(_cell(s, label, key, fmt) for s in summaries))
    lines = []
    reasons = sorted({s["engine_reason"] for s in summaries if s.get("engine_reason")})
    if reasons:
        lines.append("SimPy engine: " + "; ".join(reasons))
    lines += warning_lines(summaries)
    if lines:
        t.caption, t.caption_justify = "\n".join(lines), "left"
    return t


def warning_lines(summaries: list[dict]) -> list[str]:
    """``warning: <policy>: <text>``, each once, in run order."""
    seen = dict.fromkeys(f"warning: {s.get('policy', '')}: {w}" for s in summaries for w in s.get("warnings") or ())
    return list(seen)
