"""Render summary dicts as a rich table: one column per run, one row per metric."""

from __future__ import annotations

from rich.table import Table

__all__ = ["summary_table", "TABLE_ROWS"]

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


def _cell(s: dict, label: str, key: str, fmt: str) -> str:
    if label.startswith("completed"):
        return f"{s['completed']} / {s['rejected']} / {s['unfinished']}"
    if label.startswith("MFU"):
        return f"{s['mfu']:.1%} / {s['mbu']:.1%}"
    if key == "itl":
        return f"{s['median_itl_ms']:.1f} / {s['p99_itl_ms']:.1f} / {s['max_itl_ms']:.1f}"
    if key == "engine":
        return str(s.get("engine", "?"))
    if key in ("ttft", "tpot", "e2el"):
        return f"{s[f'median_{key}_ms']:.1f} / {s[f'p99_{key}_ms']:.1f}"
    return fmt.format(s[key])


def summary_table(summaries: list[dict], title: str | None = None) -> Table:
    """A metrics x runs table (columns labelled by policy)."""
    t = Table(title=title)
    t.add_column("metric")
    for s in summaries:
        t.add_column(str(s.get("policy", "")), justify="right")
    for label, key, fmt in TABLE_ROWS:
        t.add_row(label, *(_cell(s, label, key, fmt) for s in summaries))
    reasons = sorted({s["engine_reason"] for s in summaries if s.get("engine_reason")})
    if reasons:
        t.caption = "SimPy engine: " + "; ".join(reasons)
    return t
