"""The capacity plan's report: the Pareto front of cost vs latency, and the sortable table.

Reads only the plan's rows (plan.csv as a DataFrame) and a
:class:`batchsim.reports.runs.ReportInfo`; never runs a simulation. The page reuses
the look of the compare/sweep reports (:mod:`batchsim.reports.html`,
:mod:`batchsim.reports.style`): one self-contained ``plan.html`` with the figure
embedded as base64 and every user string escaped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from batchsim.reports.html import figure_html, notes_html, page, table_html
from batchsim.reports.runs import ReportInfo
from batchsim.reports.style import new_figure, png_bytes, policy_colors, styled
from batchsim.reports.tables import Column, format_cell
from batchsim.sim.io import atomic_write_text

__all__ = ["pareto_mask", "plan_columns", "pareto_figure", "plan_page", "write_plan_report", "console_table"]

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def pareto_mask(costs: Sequence[float], latencies: Sequence[float]) -> list[bool]:
    """True for each point no other point dominates (cost and latency both <=, one <).

    Points that tie on both are all kept.
    """
    pts = list(zip(map(float, costs), map(float, latencies)))
    return [not any(c2 <= c and l2 <= lat and (c2 < c or l2 < lat) for c2, l2 in pts) for c, lat in pts]


def _metric_label(key: str) -> str:
    stat, _, rest = key.partition("_")
    name = rest.removesuffix("_ms").upper().replace("E2EL", "E2E")
    return f"{name} {'p50' if stat == 'median' else stat} (ms)"


def plan_columns(slos: Sequence[str], pareto_metric: str, target_rate: float | None) -> list[Column]:
    """The table's columns: config, capacity, each SLO metric at capacity, fleet and cost."""
    cols = [Column("configuration", "config", "text"), Column("status", "status", "text"),
            Column("capacity (req/s per replica)", "capacity_rps", "f2"),
            Column("output tok/s per replica", "output_tok_s", "f0")]
    cols += [Column(_metric_label(k), k, "f1") for k in dict.fromkeys([*slos, pareto_metric])]
    if target_rate is not None:
        cols += [Column("replicas", "replicas", "int")]
    cols += [Column("GPUs", "gpus", "int"), Column("$/hour", "usd_per_hour", "f2"),
             Column("$/1M output tokens", "usd_per_1m_output_tokens", "f3"),
             Column("Pareto", "pareto_text", "text"), Column("first failing rate (req/s)", "limit_rps", "f2"),
             Column("why it failed", "limit_reason", "text")]
    return cols


def _display_rows(frame: pd.DataFrame) -> list[dict]:
    rows = frame.astype(object).where(frame.notna(), None).to_dict(orient="records")
    for r in rows:
        r["pareto_text"] = "yes" if r.get("pareto") else ""
        for k, v in list(r.items()):
            if v is None:
                r[k] = float("nan") if k not in ("limit_reason", "knobs") else ""
    return rows


@styled
def pareto_figure(frame: pd.DataFrame, metric: str) -> Figure:
    """$/1M output tokens vs ``metric`` at capacity per configuration; the front joined.

    Colour = policy, marker = hardware, label = hardware and TP on front points.
    """
    ok = frame[frame["usd_per_1m_output_tokens"].notna()]
    fig = new_figure(9.0, 5.2)
    ax = fig.subplots()
    colors = policy_colors(list(dict.fromkeys(frame["policy"])))
    marks = {h: _MARKERS[i % len(_MARKERS)] for i, h in enumerate(dict.fromkeys(frame["hardware"]))}
    for _, r in ok.iterrows():
        on = bool(r["pareto"])
        ax.plot([r["usd_per_1m_output_tokens"]], [r[metric]], ls="none", marker=marks[r["hardware"]], ms=9 if on else 7,
                color=colors[r["policy"]], mec="black" if on else "none", mew=1.0, alpha=1.0 if on else 0.55)
    front = ok[ok["pareto"].astype(bool)].sort_values("usd_per_1m_output_tokens")
    if len(front):
        ax.step(front["usd_per_1m_output_tokens"], front[metric], where="post", color="black", lw=1.0, ls="--",
                zorder=0)
        for _, r in front.iterrows():
            ax.annotate(f"{r['hardware']} tp{int(r['tp'])} {r['policy']}", (r["usd_per_1m_output_tokens"], r[metric]),
                        textcoords="offset points", xytext=(6, 4), fontsize=8)
    for axis, values in (("x", ok["usd_per_1m_output_tokens"]), ("y", ok[metric])):
        v = values.astype(float)
        if len(v) and v.min() > 0 and v.max() / v.min() > 10:
            (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    ax.set_xlabel("$ per 1M output tokens (at the planned load)")
    ax.set_ylabel(f"{_metric_label(metric)} at capacity")
    ax.set_title("Cost vs latency at capacity (dashed: Pareto front)")
    handles = [Line2D([], [], ls="none", marker="o", color=c, label=p) for p, c in colors.items()]
    handles += [Line2D([], [], ls="none", marker=m, color="grey", label=h) for h, m in marks.items()]
    handles.append(Line2D([], [], color="black", ls="--", lw=1.0, label="Pareto front"))
    fig.legend(handles=handles, loc="outside right upper")
    return fig


def plan_page(frame: pd.DataFrame, info: ReportInfo, slos: Sequence[str], metric: str,
              target_rate: float | None) -> str:
    """The whole plan.html document."""
    rows = _display_rows(frame)
    ok = int(frame["usd_per_1m_output_tokens"].notna().sum()) if len(frame) else 0
    sections = []
    if ok:
        png = png_bytes(pareto_figure(frame, metric))
        caption = (f"Each configuration that meets the SLO at some load, at its capacity: $/1M output tokens "
                   f"vs {_metric_label(metric)}. Outlined points are not dominated (nothing is both cheaper "
                   "and faster).")
        sections.append(("Pareto front: cost vs latency", figure_html(png, "Pareto front of cost vs latency",
                                                                        caption)))
    cols = plan_columns(slos, metric, target_rate)
    sections.append(("Configurations (sorted by cost; click a header to sort)",
                     table_html(rows, cols, "plan-table")))
    sections.append(("How to read this", notes_html(_notes(target_rate))))
    return page(info, sections, footer="batchsim plan: capacity by bracketing and bisection over simulated loads")


def _notes(target_rate: float | None) -> list[str]:
    fleet = (f"replicas = ceil({target_rate:g} / capacity); GPUs = replicas x TP." if target_rate else
             "No target load was given: one replica at its capacity is priced.")
    return [
        "Capacity is the highest arrival rate per replica whose simulation met every SLO, with no request "
        "rejected or unfinished and at least 99% completed; it is within the search tolerance of the true limit.",
        "Latencies are measured at capacity, the worst a replica sees; a fleet with spare replicas runs below it.",
        fleet,
        "$/1M output tokens = $/hour / output tokens served per hour x 1e6; prices from the price table "
        "(example on-demand figures unless overridden).",
        "'does not fit': the model and its activations leave no room for KV cache at this TP; "
        "'SLO not met': no rate down to the search floor met the SLO.",
    ]


def write_plan_report(out_dir: str | Path, frame: pd.DataFrame, info: ReportInfo, slos: Sequence[str],
                      metric: str, target_rate: float | None) -> Path:
    """Write plan.html into ``out_dir``; return its path."""
    path = Path(out_dir) / "plan.html"
    atomic_write_text(path, plan_page(frame, info, slos, metric, target_rate))
    return path


def console_table(frame: pd.DataFrame, slos: Sequence[str], metric: str, target_rate: float | None,
                  title: str | None = None):
    """The plan as a rich Table for the terminal (same columns and formats as the HTML)."""
    from rich.table import Table

    cols = [c for c in plan_columns(slos, metric, target_rate) if c.key != "limit_rps"]
    t = Table(title=title)
    for c in cols:
        t.add_column(c.label, justify="left" if c.kind == "text" else "right",
                     no_wrap=c.key == "config", overflow="fold")
    for r in _display_rows(frame):
        t.add_row(*(format_cell(r, c)[0] for c in cols))
    return t

