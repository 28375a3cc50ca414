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

__all__ = ["summary_table", "deployment_label", "DISAGG_ROWS", "warning_lines", "table_rows", "TABLE_ROWS", "PREFIX_ROW", "NULL", "OFF"]

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


# Shown after "engine" when a run was a disaggregated deployment (docs/disaggregation.md).
DISAGG_ROWS: tuple[tuple[str, str, str], ...] = (
    ("GPUs (prefill + decode)", "disagg:gpus", ""),
    ("TTFT p50 split (ms)", "disagg:split", ""),
    ("prefill pool busy / MFU", "disagg:prefill", ""),
    ("decode pool busy / MBU", "disagg:decode", ""),
    ("KV link busy (max endpoint)", "disagg:link", ""),
)

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
    if key.startswith("disagg:"):
        return _disagg_cell(s.get("disaggregation"), key.removeprefix("disagg:"))
    if key in ("ttft", "tpot", "e2el"):
        return f"{_value(s, f'median_{key}_ms')} / {_value(s, f'p99_{key}_ms')}"
    return _value(s, key, fmt)


def _disagg_cell(d: dict | None, what: str) -> str:
    if not d:
        return "colocated" if what == "gpus" else NULL
    pools = d["pools"]
    if what == "gpus":
        return f"{d['gpus']} ({pools['prefill']['gpus']} + {pools['decode']['gpus']})"
    if what == "split":
        split = d["ttft_split"]
        names = (("frontend_in", "frontend"),) if "frontend_in" in split else ()
        names += (("decode_blocks", "decode blocks"),) if "decode_blocks" in split else ()
        names += (("queue", "queue"), ("prefill", "prefill"), ("transfer", "transfer"), ("decode_first", "decode"))
        return " / ".join(f"{label} {_value(split.get(k, {}), 'median_ms')}" for k, label in names)
    if what == "link":
        link = d["link"]
        return f"{max(link['utilization_prefill_egress']['max'], link['utilization_decode_ingress']['max']):.1%}"
    pool = pools[what]
    second = "mfu" if what == "prefill" else "mbu"
    return f"{pool['busy_fraction']:.1%} / {pool[second]:.1%}"


def deployment_label(summary: dict, hardware: str, replicas: int) -> str:
    """``h100-sxm x4``, or for a disaggregated deployment ``1P h100-sxm TP1 + 2D a100-80gb TP1``."""
    d = summary.get("disaggregation")
    if not d:
        return f"{hardware} x{replicas}"
    p, q = d["pools"]["prefill"], d["pools"]["decode"]
    return (f"{p['replicas']}P {p['hardware']} TP{p['tensor_parallel_size']} + "
            f"{q['replicas']}D {q['hardware']} TP{q['tensor_parallel_size']}")


def table_rows(summaries: list[dict]) -> tuple[tuple[str, str, str], ...]:
    """:data:`TABLE_ROWS`, with :data:`PREFIX_ROW` after "peak KV usage" when any
    summary had a prefix cache, and :data:`DISAGG_ROWS` at the end when any was a disaggregated
    deployment."""
    rows = TABLE_ROWS
    if any(PREFIX_ROW[1] in s for s in summaries):
        at = next(i for i, row in enumerate(TABLE_ROWS) if row[1] == "peak_kv_usage") + 1
        rows = TABLE_ROWS[:at] + (PREFIX_ROW,) + TABLE_ROWS[at:]
    if any(s.get("disaggregation") for s in summaries):
        rows = rows + DISAGG_ROWS
    return rows


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


def _short(value) -> str:
    """A knob's value on one line: a long list as its count and ends (the summary JSON has it whole)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)) and len(value) > 6:
        return f"[{len(value)} sizes {value[0]}..{value[-1]}]"
    return str(value)


def preset_lines(summaries: list[dict]) -> list[str]:
    """``engine preset <name> (<engine> <version>): k=v, ...``: the knobs a preset set, and those it could not."""
    out = {}
    for s in summaries:
        p = s.get("engine_preset")
        if not p:
            continue
        knobs = p.get("knobs", {})
        set_ = ", ".join(f"{k}={_short(v['value'])}" for k, v in knobs.items()
                         if v.get("from") in ("preset", "scenario and preset"))
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
