"""The compare report's figures: latency CDFs, percentile bars, timelines, token efficiency.

Each function takes :class:`batchsim.reports.runs.PolicyRun` values and returns a
:class:`matplotlib.figure.Figure` with one labelled series per policy in
every panel (colours from :mod:`batchsim.reports.style`), axes labelled with units.
Render with :func:`batchsim.reports.style.png_bytes`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from batchsim.sim.itl import weighted_percentile
from batchsim.reports.derive import latency_samples_ms, timeline, token_split
from batchsim.reports.runs import PolicyRun
from batchsim.reports.stats import CI_SUFFIX
from batchsim.reports.style import PERCENTILE_MARKERS, new_figure, policy_colors, policy_lines, set_log, styled

__all__ = ["latency_cdfs", "latency_percentiles", "timelines", "token_efficiency", "CDF_POINTS"]

CDF_POINTS = 2000  # NOTE: a CDF of 300k gaps is drawn from 2000 quantiles: same curve, small PNG.

_LATENCY = (("ttft", "TTFT", "time to first token"), ("tpot", "TPOT", "time per output token"),
            ("itl", "ITL", "inter-token latency"), ("e2el", "E2E", "end-to-end latency"))


def _ecdf(v: np.ndarray, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of the positive values (each ``w`` times, if given), at most
    CDF_POINTS points."""
    w = np.ones(len(v), dtype=np.int64) if w is None else np.asarray(w, dtype=np.int64)
    keep = v > 0
    v, w = v[keep], w[keep]
    order = np.argsort(v, kind="stable")
    x, cum = v[order], np.cumsum(w[order])
    n = int(cum[-1]) if len(cum) else 0
    if n <= CDF_POINTS:
        return np.repeat(x, w[order]), np.arange(1, n + 1) / max(n, 1)
    q = np.linspace(0.0, 1.0, CDF_POINTS)
    return np.array(weighted_percentile(x, w[order], q * 100)), q


def _fig_legend(fig: Figure, handles: list, ncol: int) -> None:
    fig.legend(handles=handles, loc="outside upper center", ncol=ncol)


def _policy_handles(runs: Sequence[PolicyRun], lines: dict[str, dict], **kw) -> list[Line2D]:
    return [Line2D([], [], label=r.policy, **{**lines[r.policy], **kw}) for r in runs]


@styled
def latency_cdfs(runs: Sequence[PolicyRun]) -> Figure:
    """TTFT, TPOT and ITL CDFs per policy (log x), p50 and p99 marked on each curve."""
    colors = policy_colors([r.policy for r in runs])
    lines = policy_lines([r.policy for r in runs])
    fig = new_figure(13.0, 4.2)
    axes = fig.subplots(1, 3)
    samples = {r.policy: latency_samples_ms(r.requests, r.itl, r.meta) for r in runs}
    for ax, (key, short, long) in zip(axes, _LATENCY[:3]):
        for run in runs:
            v = samples[run.policy][key]
            w = samples[run.policy].get(f"{key}_counts")
            x, y = _ecdf(v, w)
            ax.step(x, y, where="post", label=run.policy, **lines[run.policy])
            for p, marker in PERCENTILE_MARKERS.items():
                if len(v):
                    at = weighted_percentile(v, w, [p])[0] if w is not None else np.percentile(v, p)
                    ax.plot([at], [p / 100.0], marker=marker, ls="none", ms=7,
                            color=colors[run.policy], mec="black", mew=0.6)
        set_log(ax, "x", np.concatenate([samples[r.policy][key] for r in runs]))
        ax.set_ylim(0.0, 1.02)
        ax.set_title(f"{short}: {long}")
        ax.set_xlabel(f"{short} (ms{', log scale' if ax.get_xscale() == 'log' else ''})")
        ax.set_ylabel("fraction of gaps ≤ x" if key == "itl" else "fraction of requests ≤ x")
    marks = [Line2D([], [], marker=m, ls="none", color="grey", mec="black", label=f"p{p}")
             for p, m in PERCENTILE_MARKERS.items()]
    _fig_legend(fig, _policy_handles(runs, lines) + marks, len(runs) + len(marks))
    return fig


def _num(v) -> float:
    """A summary value as a float; a null (None) or missing one is NaN."""
    return np.nan if v is None else float(v)


@styled
def latency_percentiles(runs: Sequence[PolicyRun]) -> Figure:
    """p50/p90/p99 of TTFT, TPOT, ITL and E2E per policy (bars, log y, 95% CI error bars)."""
    colors = policy_colors([r.policy for r in runs])
    fig = new_figure(13.0, 4.2)
    axes = fig.subplots(1, 4)
    stats = [r.stats() for r in runs]
    keys = ("median", "p90", "p99")
    x = np.arange(len(keys))
    width = 0.8 / max(len(runs), 1)
    for ax, (metric, short, long) in zip(axes, _LATENCY):
        shown = []
        for j, (run, s) in enumerate(zip(runs, stats)):
            vals = [_num(s.get(f"{k}_{metric}_ms")) for k in keys]
            shown += vals
            err = [_num(s.get(f"{k}_{metric}_ms{CI_SUFFIX}")) for k in keys]
            yerr = None if all(np.isnan(err)) else np.nan_to_num(err)
            ax.bar(x + (j - (len(runs) - 1) / 2) * width, vals, width, color=colors[run.policy],
                   label=run.policy, yerr=yerr, capsize=3, error_kw={"elinewidth": 1})
        ax.set_xticks(x, ["p50", "p90", "p99"])
        log = set_log(ax, "y", shown)
        ax.set_title(f"{short}: {long}")
        ax.set_ylabel(f"{short} (ms{', log scale' if log else ''})")
        ax.set_xlabel("percentile over requests" if metric != "itl" else "percentile over gaps")
    _fig_legend(fig, _policy_handles(runs, {p: {"color": c} for p, c in colors.items()}, lw=6), len(runs))
    return fig


_PANELS = (
    ("batch_size", 1.0, "batch size\n(sequences)"),
    ("kv_usage", 100.0, "KV-cache usage\n(% of blocks)"),
    ("queue_depth", 1.0, "queue depth\n(waiting requests)"),
    ("mfu", 100.0, "MFU\n(% of peak FLOP/s)"),
    ("mbu", 100.0, "MBU\n(% of peak bandwidth)"),
    ("compute_share", 100.0, "step time\n(% compute-bound)"),
)


@styled
def timelines(runs: Sequence[PolicyRun], bins: int = 120) -> Figure:
    """A column per policy, each on its own time axis (a slow policy's long run
    would squeeze a fast one's into a sliver); a row per quantity with a shared
    y axis: batch size and KV usage while busy, queue depth, MFU, MBU, and the
    split of operator time into compute-bound (colour) and memory-bound (grey)."""
    lines = policy_lines([r.policy for r in runs])
    fig = new_figure(13.0, 1.95 * len(_PANELS) + 0.9)
    grid = fig.subplots(len(_PANELS), len(runs), sharey="row", squeeze=False)
    top = np.zeros(len(_PANELS))
    for j, run in enumerate(runs):
        t_end = float(run.steps["end"].max()) if len(run.steps) else 1.0
        tl = timeline(run.requests, run.steps, run.meta, t_end, bins)
        color = lines[run.policy]["color"]
        for i, (key, scale, label) in enumerate(_PANELS):
            ax = grid[i, j]
            y = tl[key].to_numpy() * scale
            ax.plot(tl["t"], y, label=run.policy, lw=1.2, color=color)
            if key == "compute_share":
                ax.fill_between(tl["t"], 0, y, color=color, alpha=0.35, lw=0)
                ax.fill_between(tl["t"], y, 100.0, where=~np.isnan(y), color="#9aa0a6", alpha=0.35, lw=0)
            ax.set_xlim(0, t_end)
            top[i] = max(top[i], float(np.nanmax(y)) if np.isfinite(y).any() else 0.0)
            if j == 0:
                ax.set_ylabel(label)
        grid[0, j].set_title(run.policy, color=color)
        grid[-1, j].set_xlabel(f"simulated time (s; bins of {t_end / bins:.3g} s)")
    for i, (key, _, _) in enumerate(_PANELS):  # shared per row: set once, after every column
        grid[i, 0].set_ylim(0, 100.0 if key == "compute_share" else max(top[i] * 1.05, 1e-9))
    return fig


_SPLIT = (("prefill", "useful prefill", "#4c72b0"), ("decode", "useful decode", "#55a868"),
          ("prompt_padding", "prompt padding", "#dd8452"), ("dead_slots", "dead slots (finished rows)", "#c44e52"))


@styled
def token_efficiency(runs: Sequence[PolicyRun]) -> Figure:
    """Where billed tokens went (useful, padding, dead slots) and the useful share per policy."""
    colors = policy_colors([r.policy for r in runs])
    fig = new_figure(13.0, 1.2 + 0.55 * len(runs) + 1.0)
    left, right = fig.subplots(1, 2, width_ratios=(2.2, 1))
    names = [r.policy for r in runs]
    y = np.arange(len(runs))[::-1]
    shares = []
    for run in runs:
        split = token_split(run.steps)
        total = sum(split.values()) or 1.0
        shares.append([split[k] / total * 100.0 for k, _, _ in _SPLIT])
    shares = np.array(shares).reshape(len(runs), len(_SPLIT))
    base = np.zeros(len(runs))
    for i, (_, label, color) in enumerate(_SPLIT):
        left.barh(y, shares[:, i], left=base, color=color, label=label, height=0.6)
        base += shares[:, i]
    left.set_yticks(y, names)
    left.set_xlim(0, 100)
    left.set_xlabel("share of billed tokens (%)")
    left.set_title("Billed tokens by kind", loc="left")
    fig.legend(handles=left.get_legend_handles_labels()[0], loc="outside upper center", ncol=len(_SPLIT))
    for run, yy in zip(runs, y):
        s = run.stats()
        eff, half = 100.0 * s.get("token_efficiency", np.nan), 100.0 * s.get("token_efficiency" + CI_SUFFIX, np.nan)
        right.barh([yy], [eff], color=colors[run.policy], label=run.policy, height=0.6,
                   xerr=None if np.isnan(half) else [half], capsize=3)
        right.text(min(eff + np.nan_to_num(half), 100.0) + 1.5, yy, f"{eff:.1f}%", va="center", fontsize=9)
    right.set_yticks(y, names)
    right.set_xlim(0, 118)
    right.set_xlabel("token efficiency: useful / billed tokens (%)")
    right.set_title("Token efficiency", loc="left")
    return fig
