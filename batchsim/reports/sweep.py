"""Latency and throughput against offered load: the sweep's table, saturation and figure.

A sweep frame has one row per (policy, rate) with the summary keys (means,
and ``_ci95`` half-widths with several seeds) plus the load-window columns
of :func:`batchsim.reports.derive.load_window`.

Saturation rule (docs/reports.md): a (policy, rate) point is *saturated* when
the output tokens it served per second while requests were still arriving
fall below :data:`SATURATION_RATIO` of the output tokens offered per second
in that window. A policy's saturation point is the lowest swept rate that is
saturated; ``None`` when none is.

A closed loop's sweep (the ``concurrency`` column: clients, not a rate) cannot fall behind its
offered load, since its clients send only when answered; its points are *saturated* once the
served output throughput reaches :data:`SATURATION_RATIO` of the policy's highest in the sweep,
where adding clients stops adding throughput and only adds latency.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from batchsim.reports.stats import CI_SUFFIX
from batchsim.reports.style import new_figure, policy_lines, set_log, styled
from batchsim.sim.measure import SHORT_SPANS, TAIL_SPANS, e2e_spans, steady_share

__all__ = ["SATURATION_RATIO", "load_column", "mark_saturation", "saturation_points", "saturation_text", "sweep_figure"]

SATURATION_RATIO = 0.9


def load_column(frame: pd.DataFrame) -> str:
    """The swept load's column: ``rate`` (req/s) or ``concurrency`` (closed-loop clients)."""
    return "concurrency" if "concurrency" in frame.columns and "rate" not in frame.columns else "rate"


def mark_saturation(frame: pd.DataFrame) -> pd.DataFrame:
    """Add ``served_ratio`` and ``saturated`` (served < 90% of offered) columns (a concurrency
    sweep: served throughput at 90% of the policy's highest or more)."""
    out = frame.copy()
    if load_column(out) == "concurrency":
        served = out["served_output_throughput"].to_numpy(dtype=float)
        best = out.groupby("policy", sort=False)["served_output_throughput"].transform("max").to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(best > 0, served / best, 1.0)
        out["served_ratio"] = ratio
        sat = ratio >= SATURATION_RATIO
        # NOTE: when only the most clients swept come within 10% of the highest, throughput was still
        # rising there: nothing shows where it levels off.
        last = out.groupby("policy", sort=False)["concurrency"].transform("max").to_numpy() == out["concurrency"].to_numpy()
        alone = out.assign(_s=sat).groupby("policy", sort=False)["_s"].transform("sum").to_numpy() == 1
        out["saturated"] = sat & ~(last & alone)
        return out
    if "load_window_s" in out and "median_e2el_ms" in out:  # (how many E2E times the load window spans)
        spans = [e2e_spans(s, e) for s, e in zip(out["load_window_s"], out["median_e2el_ms"])]
        out["window_e2els"] = np.array([math.nan if v is None else v for v in spans], dtype=float)
        # (and that span over what a steady state needs: under 1, a saturation point there is SHORT)
        tail = out["p99_e2el_ms"] if "p99_e2el_ms" in out else [None] * len(out)
        share = [steady_share(s, e, t) for s, e, t in zip(out["load_window_s"], out["median_e2el_ms"], tail)]
        out["window_steady_share"] = np.array([math.nan if v is None else v for v in share], dtype=float)
    offered = out["offered_output_throughput"].to_numpy(dtype=float)
    served = out["served_output_throughput"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(offered > 0, served / offered, 1.0)
    out["served_ratio"] = ratio
    out["saturated"] = ratio < SATURATION_RATIO
    return out


def saturation_points(frame: pd.DataFrame) -> dict[str, float | None]:
    """Each policy's lowest saturated rate (None when it kept up at every rate)."""
    out: dict[str, float | None] = {}
    for policy, rows in frame.groupby("policy", sort=False):
        sat = rows[rows["saturated"].astype(bool)]
        out[str(policy)] = float(sat[load_column(frame)].min()) if len(sat) else None
    return out


_PANELS = (
    ("median_ttft_ms", "TTFT p50", "ms, log scale", True),
    ("p99_ttft_ms", "TTFT p99", "ms, log scale", True),
    ("median_tpot_ms", "TPOT p50", "ms, log scale", True),
    ("p99_tpot_ms", "TPOT p99", "ms, log scale", True),
    ("served_output_throughput", "Output throughput under load", "tokens/s served in the load window", False),
    ("request_goodput", "Goodput (requests meeting every SLO)", "requests/s", False),
)


def _offered_lines(ax, key: str, frame: pd.DataFrame) -> Line2D | None:
    """The offered load on the throughput and goodput panels (dashed black)."""
    if load_column(frame) != "rate":
        return None  # (a closed loop offers what it is served)
    by_rate = frame.groupby("rate", sort=True)
    if key == "served_output_throughput":
        x = np.array(list(by_rate.groups))
        y = by_rate["offered_output_throughput"].mean().to_numpy()
    elif key == "request_goodput":
        x = np.array(sorted(frame["rate"].unique()))
        y = x
    else:
        return None
    (line,) = ax.plot(x, y, ls="--", color="black", lw=1.0, label="_offered")
    return line


@styled
def sweep_figure(frame: pd.DataFrame, policies: Sequence[str]) -> Figure:
    """Six panels against offered load (req/s), a line per policy with 95% CI
    error bars when seeds > 1, and each policy's saturation point marked by a
    dotted vertical line in its colour."""
    lines = policy_lines(policies)
    sat = saturation_points(frame)
    col = load_column(frame)
    fig = new_figure(13.0, 8.6)
    axes = fig.subplots(2, 3).ravel()
    for ax, (key, title, unit, log) in zip(axes, _PANELS):
        for p in policies:
            rows = frame[frame["policy"] == p].sort_values(col)
            x, y = rows[col].to_numpy(dtype=float), rows[key].to_numpy(dtype=float)
            ax.plot(x, y, marker="o", ms=4, label=p, **lines[p])
            if key + CI_SUFFIX in rows:
                err = np.nan_to_num(rows[key + CI_SUFFIX].to_numpy(dtype=float))
                ax.errorbar(x, y, yerr=err, fmt="none", ecolor=lines[p]["color"], capsize=3, elinewidth=1)
            if sat.get(p) is not None:
                ax.axvline(sat[p], color=lines[p]["color"], ls=":", lw=1.4)
                at = x == sat[p]
                ax.plot(x[at], y[at], marker="*", ms=14, ls="none", color=lines[p]["color"],
                        mec="black", mew=0.7, zorder=5)
        _offered_lines(ax, key, frame)
        if not (log and set_log(ax, "y", frame[key])):
            ax.set_ylim(bottom=0)
            unit = unit.replace(", log scale", "")
        ax.set_title(title, loc="left")
        ax.set_ylabel(f"{title.split(' (')[0]} ({unit})")
        if col == "rate":
            ax.set_xlabel("offered load (requests/s)")
        else:
            ax.set_xlabel("closed-loop clients (log scale)")
            ax.set_xscale("log", base=2)
    handles = [Line2D([], [], marker="o", ms=4, label=p, **lines[p]) for p in policies]
    handles.append(Line2D([], [], color="grey", ls=":", lw=1.4, marker="*", ms=11, mec="black",
                          label="saturation point"))
    if col == "rate":
        handles.append(Line2D([], [], color="black", ls="--", lw=1.0, label="offered load"))
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles))
    return fig


def saturation_text(points: dict[str, float | None], load: str = "rate",
                    frame: pd.DataFrame | None = None) -> list[str]:
    """One human line per policy: where it saturates (``load``: the frame's load column); with the
    sweep's ``frame``, a rate sweep's saturation point whose load window spans fewer than SHORT_SPANS
    E2E times says it may be early."""
    lines = []
    short = {}
    if frame is not None and load == "rate" and "window_steady_share" in frame:
        for p, r in points.items():
            row = frame[(frame["policy"] == p) & (frame["rate"] == r)] if r is not None else frame.iloc[:0]
            share = float(row["window_steady_share"].iloc[0]) if len(row) else math.nan
            if share < 1.0:
                spans = float(row["window_e2els"].iloc[0])
                short[p] = (f" (SHORT: its load window there spans {share:.0%} of what a steady state needs, "
                            f"{SHORT_SPANS:g} median and {TAIL_SPANS:g} p99 E2E times ({spans:.1f} median E2Es): "
                            "saturation may be marked early; raise workload.num_requests)")
    for p, r in points.items():
        if load == "concurrency":
            lines.append(f"{p}: throughput levels off at {r:g} clients (within {1 - SATURATION_RATIO:.0%} of its "
                         "highest)" if r is not None and not math.isnan(r)
                         else f"{p}: throughput still rising at the most clients swept")
            continue
        lines.append(f"{p}: saturates at {r:g} req/s{short.get(p, '')}" if r is not None and not math.isnan(r)
                     else f"{p}: kept up at every swept rate")
    return lines
