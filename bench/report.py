"""Markdown for a result document: the table, the comparison, the linearity check.

Reads only the plain dictionaries of :mod:`bench.runner` and
:mod:`bench.compare`; it computes nothing that is not already in them.
"""

from __future__ import annotations

from bench.scenarios import size_label

__all__ = ["results_table", "comparison_table", "linearity_lines", "render"]


def _f(x, fmt: str = ".1f", missing: str = "—") -> str:
    return missing if x is None else format(x, fmt)


def _wall_cell(r: dict) -> str:
    if r["status"] == "ok":
        return _f(r["wall_s"])
    if r["status"] == "timeout":
        est = r.get("est_wall_s")
        return f"timeout ({_f(r.get('elapsed_s'), '.0f')} s" + (f"; est. {est:.0f} s)" if est else ")")
    return r["status"]


def results_table(doc: dict) -> str:
    """One row per case: wall s, CPU s, req/s, steps/s, peak RSS, steps, ratio, load average."""
    lines = ["| case | wall s | CPU s | req/s | steps/s | peak RSS MiB | steps | ratio | load avg |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["results"]:
        approx = "~" if r["status"] == "timeout" else ""
        rps = r.get("req_per_s")
        sps = r.get("steps_per_s")
        lines.append(
            f"| {r['key']} | {_wall_cell(r)} | {_f(r.get('cpu_s') or r.get('elapsed_cpu_s'))} | {approx + _f(rps, ',.0f') if rps is not None else '—'} | "
            f"{approx + _f(sps, ',.0f') if sps is not None else '—'} | {_f(r.get('peak_rss_mb'), ',.0f')} | "
            f"{_f(r.get('steps'), ',d')} | {_f(r.get('ratio'), ',.0f')} | {_f((r.get('loadavg') or [None])[0], '.2f')} |")
    return "\n".join(lines)


def comparison_table(rows: list[dict], prev_label: str) -> str:
    """Ratio then and now per case, flagged beyond the noise threshold."""
    if not rows:
        return f"No case to compare with {prev_label} (different cases or calibration version)."
    lines = [f"Compared with {prev_label} (ratio = CPU s / calibration loop CPU s):", "",
             "| case | ratio before | ratio now | change | flag |", "|---|---:|---:|---:|---|"]
    for r in rows:
        change = "—" if r["change"] is None else f"{r['change']:+.0%}"
        flag = r["flag"] + ("; steps differ (not like for like)" if r["steps_differ"] else "")
        lines.append(f"| {r['key']} | {_f(r['prev_ratio'], ',.0f')} | {_f(r['ratio'], ',.0f')} | "
                     f"{change} | {flag} |")
    return "\n".join(lines)


def linearity_lines(rows: list[dict]) -> str:
    """``policy load rN: 10k 4.1 s -> 100k 43 s (x10.5; ideal x10) -> 1M timeout``."""
    out = []
    for g in rows:
        parts = []
        for p in g["points"]:
            wall = "—" if p["wall_s"] is None else f"{'~' if p['estimate'] else ''}{p['wall_s']:.1f} s"
            if p["status"] not in ("ok", "timeout"):
                wall = p["status"]
            text = f"{size_label(p['size'])} {wall}"
            if "size_ratio" in p:
                ratio = "—" if p.get("ratio") is None else f"x{p['ratio']:.1f}"
                text += f" ({ratio}; ideal x{p['size_ratio']:g})"
            parts.append(text)
        out.append(f"- {g['policy']} {g['load']} r{g['replicas']}: " + " -> ".join(parts))
    return "\n".join(out)


def _code_note(doc: dict) -> list[str]:
    codes = sorted({r.get("code") for r in doc["results"]} - {None})
    if len(codes) < 2:
        return []
    return [f"NOTE: the simulator's sources changed during this run (code {', '.join(codes)}); "
            "each case records the code it ran.", ""]


def render(doc: dict, comparison: list[dict] | None, prev_label: str | None,
           linearity: list[dict]) -> str:
    """The whole markdown report of one run."""
    host, git = doc["host"], doc["git"]
    head = [f"# Benchmark {doc['label']}", "",
            f"Created {doc['created']}; commit {git['commit'][:10]}"
            f"{' (simulator sources modified)' if git['dirty'] else ''}, code {git['code']}; "
            f"Python {host['python']} on {host['cpus']} CPUs; load average "
            f"{host['loadavg_start'][0]:.2f} at start, {host.get('loadavg_end', [0])[0]:.2f} at end; "
            f"calibration loop median {_f(doc['calibration'].get('median_cpu_s'), '.3f')} CPU s "
            f"({_f(doc['calibration']['median_s'], '.3f')} wall s).", "",
            results_table(doc), "",
            *_code_note(doc),
            "Ratio: CPU s over the calibration loop's CPU s (what runs compare). `~` marks a "
            "timed-out case's rates, measured over the part it ran; its estimated total "
            "extrapolates the completed fraction.", ""]
    if comparison is not None and prev_label is not None:
        head += [comparison_table(comparison, prev_label), ""]
    if any(len(g["points"]) > 1 for g in linearity):
        head += ["Wall time from one size to the next (linear = the size ratio):", "",
                 linearity_lines(linearity), ""]
    return "\n".join(head)
