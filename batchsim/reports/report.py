"""Write a whole report folder: CSVs, PNGs and the self-contained report.html.

The compare report (:func:`write_compare_report`) and the sweep report
(:func:`write_sweep_report`) both write their files as one set
(``batchsim.sim.io.write_set``: a temporary folder, the manifest last, put in
place together), so a killed run leaves the old set or the new one, never a mix;
other files in the folder (a run's ``points/``) are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd

from batchsim.reports import html as H
from batchsim.reports import plots
from batchsim.reports.runs import PolicyRun, ReportInfo
from batchsim.reports.style import png_bytes
from batchsim.reports.sweep import load_column, saturation_points, saturation_text, sweep_figure
from batchsim.reports.tables import (LATENCY_COLUMNS, REJECTION_COLUMNS, SWEEP_COLUMNS, UTILIZATION_COLUMNS, Column,
                                     csv_frame, rejection_rows, runs_frame, summary_frame)
from batchsim.sim.io import atomic_write_bytes, atomic_write_text, write_csv, write_set

__all__ = ["write_compare_report", "write_sweep_report", "COMPARE_FIGURES", "DEFINITIONS"]

# (file name, builder, section title, alt text, caption)
COMPARE_FIGURES: tuple[tuple[str, Callable, str, str, str], ...] = (
    ("latency_cdf.png", plots.latency_cdfs, "Latency distributions", "TTFT, TPOT and ITL CDFs per policy",
     "Cumulative distributions over the measured requests (log x). Markers: p50 (circle) and "
     "p99 (triangle) of each policy."),
    ("latency_percentiles.png", plots.latency_percentiles, "Latency percentiles",
     "latency percentiles per policy",
     "p50, p90 and p99 of each latency per policy (log y); error bars are 95% confidence "
     "intervals over seeds when there are several."),
    ("timelines.png", plots.timelines, "Timelines",
     "timelines of batch size, KV usage, queue depth, MFU, MBU and compute-bound share",
     "What the replicas were doing over simulated time, averaged in equal time bins: a column per "
     "policy on its own time axis (a slow policy runs longer), one y scale per row. Bottom row: "
     "operator time that was compute-bound (colour) vs memory-bound (grey)."),
    ("token_efficiency.png", plots.token_efficiency, "Token efficiency",
     "billed tokens by kind per policy",
     "Billed tokens split into useful prefill and decode, padding to the longest prompt of a "
     "static batch, and dead slots (finished sequences still billed until their batch ends)."),
)

DEFINITIONS = (
    "TTFT: first output token − arrival. TPOT: (completion − first token) / (output tokens − 1). "
    "ITL: gap between consecutive tokens of a request. E2E: completion − arrival.",
    "Goodput: completed requests per second that met every SLO. Token efficiency: useful tokens / "
    "billed tokens (padding and dead slots are billed but useless).",
    "MFU: useful FLOPs / peak FLOP/s over wall time; MBU: bytes moved / peak bandwidth over wall time.",
)


SATURATION_RULE = (
    "Rule: a point is saturated when the output tokens served per second while requests were still "
    "arriving (after the first quarter of the arrival span) fall below 90% of the output tokens "
    "offered per second in that window; a policy's saturation point is its lowest saturated rate.")
CLOSED_SATURATION_RULE = (
    "Rule (closed loop): clients send only when answered, so a point cannot fall behind its load; a "
    "policy's saturation point is the fewest clients at which the output tokens served per second "
    "reach 90% of the most it served at any swept client count.")


def _all_columns(frame: pd.DataFrame) -> list[Column]:
    return [Column(c, c, "g" if pd.api.types.is_numeric_dtype(frame[c]) else "text") for c in frame.columns]


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in frame.to_dict(orient="records")]


def _bytes_writer(data: bytes) -> Callable[[Path], None]:
    return lambda p: atomic_write_bytes(p, data)


def _text_writer(text: str) -> Callable[[Path], None]:
    return lambda p: atomic_write_text(p, text)


def _csv_writer(frame: pd.DataFrame) -> Callable[[Path], None]:
    return lambda p: write_csv(p, frame)


def _write(out_dir: str | Path, writers: dict[str, Callable[[Path], None]], info: ReportInfo,
           kind: str) -> dict[str, Path]:
    """Write the files as one set; their final paths by name."""
    from batchsim import __version__

    write_set(out_dir, writers, {"written_by": f"batchsim {__version__}", "kind": kind, "scenario": info.scenario})
    return {name: Path(out_dir) / name for name in writers}


def write_compare_report(out_dir: str | Path, runs: Sequence[PolicyRun], info: ReportInfo,
                         policy_knobs: Sequence[str] = (),
                         extra_files: Mapping[str, Callable[[Path], None]] | None = None) -> dict[str, Path]:
    """Write summary.csv (runs.csv with seeds > 1), the PNGs and report.html (and
    ``extra_files``: name -> writer of that path) as one set."""
    writers: dict[str, Callable[[Path], None]] = {}
    frame = summary_frame(runs)
    writers["summary.csv"] = _csv_writer(frame)
    if any(r.seeds > 1 for r in runs):
        writers["runs.csv"] = _csv_writer(runs_frame(runs))
    rows = [r.stats() for r in runs]
    ci = " Second lines: ± 95% CI half-width over seeds." if info.seeds > 1 else ""
    sections = _warning_sections(rows, rejection_rows(runs))
    sections += [
        ("Throughput and latency", H.table_html(rows, LATENCY_COLUMNS, "latency")
         + H.notes_html([f"Click a column header to sort.{ci} '—': no measured request has this "
                         "latency (the policy's measured window is empty)."])),
        ("Utilization and efficiency", H.table_html(rows, UTILIZATION_COLUMNS, "utilization")),
    ]
    for name, build, title, alt, caption in COMPARE_FIGURES:
        png = png_bytes(build(runs))
        writers[name] = _bytes_writer(png)
        if info.seeds > 1 and name in ("latency_cdf.png", "timelines.png"):
            caption += " Drawn from the first seed's records."
        sections.append((title, H.figure_html(png, alt, caption)))
    if policy_knobs:
        sections.append(("Policies compared (every knob)", H.notes_html(policy_knobs)))
    sections.append(("All metrics (summary.csv)", "<details><summary>show every column</summary>"
                     + H.table_html(_records(frame), _all_columns(frame), "all-metrics") + "</details>"))
    sections.append(("Definitions", H.notes_html(DEFINITIONS)))
    writers["report.html"] = _text_writer(H.page(info, sections, footer=f"batchsim {info.version}"))
    writers.update(extra_files or {})
    return _write(out_dir, writers, info, "compare")


def _listed(v) -> list:
    """A summary's list value; anything else (a missing cell's NaN) is empty."""
    return list(v) if isinstance(v, (list, tuple)) else []


def _warning_sections(stats: Sequence[dict], rejections: Sequence[dict],
                      label: Callable[[dict], str] = lambda s: str(s.get("policy", ""))) -> list[tuple[str, str]]:
    """The report's first sections when a run needs them: every summary warning (once),
    and the rejected requests of each policy that rejects, by kind."""
    lines = list(dict.fromkeys(f"{label(s)}: {w}" for s in stats for w in _listed(s.get("warnings"))))
    out = []
    if lines:
        out.append(("Warnings", H.notes_html(lines)))
    if rejections:
        out.append(("Rejected requests", H.table_html(list(rejections), REJECTION_COLUMNS, "rejections")
                    + H.notes_html(["A rejected request never runs: it counts as failing in goodput, and the "
                                    "policy's latencies describe only the requests it served, so compare "
                                    "them with care."])))
    return out


def write_sweep_report(out_dir: str | Path, frame: pd.DataFrame, policies: Sequence[str],
                       info: ReportInfo, policy_knobs: Sequence[str] = (),
                       extra_files: Mapping[str, Callable[[Path], None]] | None = None) -> dict[str, Path]:
    """Write sweep.csv, sweep.png and report.html for a load sweep (and ``extra_files``:
    name -> writer of that path) as one set."""
    writers: dict[str, Callable[[Path], None]] = {"sweep.csv": _csv_writer(csv_frame(frame))}
    png = png_bytes(sweep_figure(frame, policies))
    writers["sweep.png"] = _bytes_writer(png)
    load = load_column(frame)
    sat = saturation_text(saturation_points(frame), load, frame)
    rows = _records(frame)
    for r in rows:
        r["saturated"] = "yes" if r.get("saturated") else "no"
    unit = "req/s" if load == "rate" else "clients"
    point = lambda r: f"{r.get('policy', '')} @ {r.get(load, float('nan')):g} {unit}"  # noqa: E731
    columns = SWEEP_COLUMNS if load == "rate" else tuple(  # (a closed loop offers what it is served)
        Column("clients", "concurrency", "f0") if c.key == "rate" else c for c in SWEEP_COLUMNS
        if c.key != "offered_output_throughput")
    sections = _warning_sections(rows, [], point) + [
        ("Saturation", H.notes_html(sat + [SATURATION_RULE if load == "rate" else CLOSED_SATURATION_RULE])),
        ("Latency and throughput against offered load", H.figure_html(
            png, "latency, throughput and goodput against offered load",
            "A line per policy; stars and dotted verticals mark each policy's saturation point; dashed "
            "black lines are the offered load. Throughput under load is what the saturation rule "
            "compares with the offered load (the tables also give the whole-run output throughput). "
            "Error bars: 95% CI over seeds when there are several.")) if load == "rate" else
        ("Latency and throughput against closed-loop clients", H.figure_html(
            png, "latency, throughput and goodput against closed-loop clients",
            "A line per policy; stars and dotted verticals mark each policy's saturation point, where "
            "served throughput comes within 10% of its highest. Error bars: 95% CI over seeds when there "
            "are several.")),
        ("Sweep points", H.table_html(rows, columns, "sweep")),
        ("Policies compared (every knob)", H.notes_html(policy_knobs)),
        ("All columns (sweep.csv)", "<details><summary>show every column</summary>"
         + H.table_html(_records(csv_frame(frame)), _all_columns(frame), "all-columns") + "</details>"),
        ("Definitions", H.notes_html(DEFINITIONS)),
    ]
    writers["report.html"] = _text_writer(H.page(info, sections, footer=f"batchsim {info.version}"))
    writers.update(extra_files or {})
    return _write(out_dir, writers, info, "sweep")
