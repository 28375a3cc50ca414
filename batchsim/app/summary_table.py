"""Render summary dicts as a rich table: one column per run, one row per metric.

A null latency (no measured request has it) shows as "—"; each run's
``warnings`` are printed once under the table, prefixed by its policy. A
summary averaged over seeds shows each metric as ``mean ± half-width`` of its
95% interval (counts as means).

The prefix-cache hit rate (:data:`PREFIX_ROW`) is a row only when a shown run
had a prefix cache (its summary has ``prefix_cache_hit_rate``); there, a run
without one (caching off, or static / dynamic, which have none) shows "off".
Runs without prefix caching, the default, keep the table they always had.
"""

from __future__ import annotations

from rich.table import Table

from batchsim.reports.stats import CI_SUFFIX

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


def _value(s: dict, key: str, fmt: str = "{:.1f}") -> str:
    """``s[key]`` formatted, with `` ± <half-width>`` when the summary is a mean over
    seeds (``<key>_ci95``, batchsim.reports.stats.aggregate); "—" when null."""
    v = s.get(key)
    if v is None:
        return NULL
    text = fmt.format(v)
    half = s.get(key + CI_SUFFIX)
    if half is not None and half == half:  # (NaN: one seed)
        text += " ± " + fmt.format(half).rstrip("%") + ("%" if fmt.endswith("%}") else "")
    return text


def _count(s: dict, key: str) -> str:
    v = s[key]
    return f"{v:.1f}" if isinstance(v, float) and not v.is_integer() else f"{int(v)}"


def _cell(s: dict, label: str, key: str, fmt: str) -> str:
    if label.startswith("completed"):
        return " / ".join(_count(s, k) for k in ("completed", "rejected", "unfinished"))
    if label.startswith("MFU"):
        return f"{_value(s, 'mfu', '{:.1%}')} / {_value(s, 'mbu', '{:.1%}')}"
    if key == "itl":
        return f"{_value(s, 'median_itl_ms')} / {_value(s, 'p99_itl_ms')} / {_value(s, 'max_itl_ms')}"
    if key == "engine":
        return str(s.get("engine", "?"))
    if key == PREFIX_ROW[1] and key not in s:
        return OFF
    if key in ("ttft", "tpot", "e2el"):
        return f"{_value(s, f'median_{key}_ms')} / {_value(s, f'p99_{key}_ms')}"
    return _value(s, key, fmt)


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
    lines += preset_lines(summaries)
    lines += warning_lines(summaries)
    if lines:
        t.caption, t.caption_justify = "\n".join(lines), "left"
    return t


def preset_lines(summaries: list[dict]) -> list[str]:
    """``engine preset <name> (<engine> <version>): k=v, ...``: the knobs a preset set, and those it could not."""
    out = {}
    for s in summaries:
        p = s.get("engine_preset")
        if not p:
            continue
        knobs = p.get("knobs", {})
        set_ = ", ".join(f"{k}={v['value']}" for k, v in knobs.items() if v.get("from") == "preset")
        line = f"engine preset {p['name']} ({p['engine']} {p['version']}): {set_ or 'nothing'}"
        left = [f"{k} ({v['from'].removeprefix('left out: ')})" for k, v in knobs.items()
                if str(v.get("from", "")).startswith("left out")]
        if left:
            line += "; left out: " + ", ".join(left)
        out[line] = None
    return list(out)


def warning_lines(summaries: list[dict]) -> list[str]:
    """``warning: <policy>: <text>``, each once, in run order."""
    seen = dict.fromkeys(f"warning: {s.get('policy', '')}: {w}" for s in summaries for w in s.get("warnings") or ())
    return list(seen)
