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

__all__ = ["pareto_mask", "plan_columns", "pareto_figure", "plan_page", "write_plan_report", "console_table",
           "has_intervals"]

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


def plan_columns(slos: Sequence[str], pareto_metric: str, target_rate: float | None,
                 rejections: bool = False, intervals: bool = False, per_gpu: bool = False,
                 clients: bool = False) -> list[Column]:
    """The table's columns: config, capacity, each SLO metric at capacity, fleet and cost
    (and the requests rejected at capacity, when ``--allow-rejections`` let them through).
    With ``intervals`` (points pooled over seeds) the capacity is the low end of its 95%
    interval, the interval and estimate follow it, and each metric shows mean ± half-width. With
    ``per_gpu`` (a plan with disaggregated deployments, whose units differ in GPUs) the capacity
    per GPU follows it. With ``clients`` (a closed-loop plan, which searches clients) the clients
    per unit come first and the capacity is the throughput they get."""
    cols = [Column("configuration", "config", "text"), Column("status", "status", "text")]
    if clients:
        cols += [Column("clients per unit", "capacity_clients", "int")]
    if clients:  # (the clients' interval, then the throughput the low end's clients get, with its own)
        if intervals:
            cols += [Column("clients 95% interval (estimate)", "capacity_interval", "text"),
                     Column("throughput at capacity (req/s per unit, 95% low end)", "capacity_rps", "f2"),
                     Column("throughput 95% interval (estimate)", "throughput_interval", "text"),
                     Column("seeds at capacity", "seeds", "int")]
        else:
            cols += [Column("throughput at capacity (req/s per unit)", "capacity_rps", "f2")]
    elif intervals:
        cols += [Column("capacity (req/s per unit, 95% low end)", "capacity_rps", "f2"),
                 Column("capacity 95% interval (estimate)", "capacity_interval", "text"),
                 Column("seeds at capacity", "seeds", "int")]
    else:
        cols += [Column("capacity (req/s per unit)", "capacity_rps", "f2")]
    if per_gpu:
        cols += [Column("req/s per GPU", "capacity_rps_per_gpu", "f2")]
    cols += [Column("output tok/s per unit", "output_tok_s", "f0")]
    if rejections:
        cols += [Column("rejected at capacity", "rejected", "int")]
    metrics = dict.fromkeys([*slos, pareto_metric])
    if intervals:
        cols += [Column(_metric_label(k) + " ± 95%", f"{k}_shown", "text") for k in metrics]
    else:
        cols += [Column(_metric_label(k), k, "f1") for k in metrics]
    if target_rate is not None:
        cols += [Column("replicas", "replicas", "int")]
    cols += [Column("GPUs", "gpus", "int"), Column("$/hour", "usd_per_hour", "f2"),
             Column("$/1M output tokens", "usd_per_1m_output_tokens", "f3"),
             Column("Pareto", "pareto_text", "text"),
             Column("first failing clients", "limit_clients", "int") if clients else
             Column("first failing rate (req/s)", "limit_rps", "f2"),
             Column("why it failed", "limit_reason", "text")]
    return cols


def has_intervals(frame: pd.DataFrame) -> bool:
    """Whether the plan's points were pooled over seeds (its rows carry intervals)."""
    return "seeds" in frame and bool((pd.to_numeric(frame["seeds"], errors="coerce") > 1).any())


_TEXT_KEYS = ("limit_reason", "knobs", "capacity_interval", "throughput_interval", "interval_note", "reproduce",
              "policy_knobs")


def _interval_text(r: dict, clients: bool = True) -> str:
    """The capacity's 95% interval (its estimate): in clients for a closed loop (with ``clients``),
    else in req/s: a rate's search interval, or a closed loop's throughput at its capacity."""
    if clients and r.get("capacity_clients") is not None:  # (a closed loop: the search is in clients)
        lo, mid, hi = r.get("capacity_clients"), r.get("capacity_clients_estimate"), r.get("capacity_clients_high")
        if not lo:
            return ""
        high = f"{hi:g}" if hi is not None else "?"
        return f"{lo:g}–{high} clients" + (f" ({mid:g})" if mid is not None else "")
    lo, mid, hi = r.get("capacity_rps"), r.get("capacity_estimate_rps"), r.get("capacity_high_rps")
    if not lo:
        return ""
    high = f"{hi:.2f}" if hi is not None else "?"
    return f"{lo:.2f}–{high}" + (f" ({mid:.2f})" if mid is not None else "")


def _display_rows(frame: pd.DataFrame) -> list[dict]:
    rows = frame.astype(object).where(frame.notna(), None).to_dict(orient="records")
    for r in rows:
        r["pareto_text"] = "yes" if r.get("pareto") else ""
        r["capacity_interval"] = _interval_text(r)
        r["throughput_interval"] = _interval_text(r, clients=False) if r.get("capacity_clients") is not None else ""
        for k in [k for k in r if f"{k}_ci95" in r]:
            v, half = r[k], r[f"{k}_ci95"]
            r[f"{k}_shown"] = ("" if v is None else f"{v:.1f}" if half is None else f"{v:.1f} ± {half:.1f}")
        for k, v in list(r.items()):
            if v is None:
                r[k] = float("nan") if k not in _TEXT_KEYS else ""
    return rows


@styled
def pareto_figure(frame: pd.DataFrame, metric: str) -> Figure:
    """$/1M output tokens vs ``metric`` at capacity per configuration; the front joined.

    Colour = policy, marker = hardware, label = hardware and TP on front points; with
    seeds, a vertical bar is the metric's 95% interval at capacity.
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
        half = r.get(f"{metric}_ci95")
        if half is not None and pd.notna(half) and half > 0:
            ax.errorbar([r["usd_per_1m_output_tokens"]], [r[metric]], yerr=[[half], [half]], fmt="none",
                        ecolor=colors[r["policy"]], capsize=3, elinewidth=1, alpha=1.0 if on else 0.55)
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
              target_rate: float | None, rejections: bool = False, problems: Sequence[str] = (),
              intervals: bool | None = None) -> str:
    """The whole plan.html document (``problems``: the configurations with no capacity
    because a point was not evaluable or they reject requests, shown first)."""
    rows = _display_rows(frame)
    intervals = has_intervals(frame) if intervals is None else intervals
    ok = int(frame["usd_per_1m_output_tokens"].notna().sum()) if len(frame) else 0
    sections = []
    if problems:
        sections.append(("Configurations without a capacity", notes_html(problems)))
    if ok:
        png = png_bytes(pareto_figure(frame, metric))
        caption = (f"Each configuration that meets the SLO at some load, at its capacity: $/1M output tokens "
                   f"vs {_metric_label(metric)}. Outlined points are not dominated (nothing is both cheaper "
                   "and faster).")
        sections.append(("Pareto front: cost vs latency", figure_html(png, "Pareto front of cost vs latency",
                                                                        caption)))
    cols = plan_columns(slos, metric, target_rate, rejections, intervals, disaggregated(frame), closed_loop(frame))
    sections.append(("Configurations (sorted by cost; click a header to sort)",
                     table_html(rows, cols, "plan-table")))
    sections.append(("How to read this", notes_html(_notes(target_rate, intervals))))
    return page(info, sections, footer="batchsim plan: capacity by bracketing and bisection over simulated loads")


def _notes(target_rate: float | None, intervals: bool = False) -> list[str]:
    fleet = (f"replicas = ceil({target_rate:g} / capacity); GPUs = replicas x TP." if target_rate else
             "No target load was given: one replica at its capacity is priced.")
    seeds = ([
        "Each rate is simulated on several seeds (the same seeds for every configuration: common random "
        "numbers), and each SLO metric is a mean with its 95% interval (Student's t over seeds). A rate "
        "passes when every SLO holds at the upper end of its metric's interval, so the capacity shown, "
        "sized and priced is the low end of the capacity's 95% interval; the interval's high end is the "
        "highest rate at which no SLO is shown to fail (the lower ends), and the estimate (in brackets) "
        "judges the means. A rate adds seeds until every SLO metric's interval is narrow enough "
        "(--ci-width, up to --max-seeds); a WIDE line names any capacity where one stayed wider."]
        if intervals else
        ["One seed per point: the capacity has no interval (plan with --seeds 3 or more for one)."])
    return [*seeds,
        "A unit is one replica (colocated) or one xPyD deployment (x prefill and y decode replicas, "
        "docs/disaggregation.md). For a closed loop the search is over clients, and the capacity in req/s is the "
        "throughput the most clients that met every SLO got. Capacity is the highest arrival rate per unit whose "
        "simulation met every SLO, with no request "
        "rejected (unless --allow-rejections) or unfinished, at least 99% completed, and enough completed "
        "requests in the measured window to judge a p99 (--min-requests); it is within the search tolerance "
        "of the true limit.",
        "Latencies are measured at capacity, the worst a replica sees; a fleet with spare replicas runs below it.",
        fleet,
        "$/1M output tokens = $/hour / output tokens served per hour x 1e6; prices from the price table "
        "(example on-demand figures unless overridden).",
        "'does not fit': the model and its activations leave no room for KV cache at this TP; "
        "'SLO not met': no rate down to the search floor met the SLO; 'not evaluable': a point the "
        "search needed had too few completed requests in its measured window to judge (or a null SLO "
        "metric), so no capacity is claimed; 'rejects requests': the configuration rejects some "
        "requests at any load (too long for max_model_len, the KV cache or the step budget) and is "
        "refused unless --allow-rejections is given.",
    ]


def write_plan_report(out_dir: str | Path, frame: pd.DataFrame, info: ReportInfo, slos: Sequence[str],
                      metric: str, target_rate: float | None, rejections: bool = False,
                      problems: Sequence[str] = ()) -> Path:
    """Write plan.html into ``out_dir``; return its path."""
    path = Path(out_dir) / "plan.html"
    atomic_write_text(path, plan_page(frame, info, slos, metric, target_rate, rejections, problems))
    return path


def disaggregated(frame: pd.DataFrame) -> bool:
    """Whether a plan has disaggregated deployments (batchsim.app.capacity.grid.COLOCATED is the rest)."""
    return "deployment" in frame and bool((frame["deployment"] != "colocated").any())


def closed_loop(frame: pd.DataFrame) -> bool:
    """Whether a plan searched clients (a closed-loop scenario) rather than arrival rates."""
    return "capacity_clients" in frame and bool(frame["capacity_clients"].notna().any())


def console_table(frame: pd.DataFrame, slos: Sequence[str], metric: str, target_rate: float | None,
                  title: str | None = None, rejections: bool = False,
                  intervals: bool | None = None) -> "PlanTable":
    """The plan as a rich renderable for the terminal (same columns and formats as the HTML).

    It sizes its columns when rendered, for the console's width: a number is
    never wrapped or cut (``38603.9`` stays whole at 100 columns).
    """
    intervals = has_intervals(frame) if intervals is None else intervals
    cols = [c for c in plan_columns(slos, metric, target_rate, rejections, intervals, disaggregated(frame),
                                    closed_loop(frame))
            if c.key not in ("limit_rps", "limit_clients")]
    cells = [[format_cell(r, c)[0] for c in cols] for r in _display_rows(frame)]
    return PlanTable(cols, cells, title)


# Numeric columns dropped, in this order, when the numbers do not fit the width otherwise.
_DROPPABLE = ("output_tok_s", "usd_per_hour", "replicas", "seeds", "status", "pareto_text", "limit_reason",
              "gpus", "rejected")
_MIN_WHY = 14  # the "why it failed" column folds its text into at least this many characters
_HEADER = 12  # a numeric column widens to this many characters for its header, when there is room
_WHY = 40  # the reason column widens to this before the headers do


class PlanTable:
    """A rich renderable: the plan table laid out for the width it is rendered at.

    Every column but the two free-text ones gets a fixed width that holds its
    longest word (a number is one word) and the longest word of its header;
    the configuration and "why it failed" columns share what is left and fold.
    When even that does not fit, the least needed columns (:data:`_DROPPABLE`,
    then from the right) are left out and the caption says so: a number is
    never wrapped or cut.
    """

    def __init__(self, columns: Sequence[Column], cells: Sequence[Sequence[str]], title: str | None) -> None:
        self.columns, self.cells, self.title = list(columns), [list(r) for r in cells], title

    def _word(self, i: int) -> int:
        """The longest word of column ``i``'s header and cells."""
        words = self.columns[i].label.split() + [w for row in self.cells for w in row[i].split()]
        return max([len(w) for w in words] + [1])

    def _full(self, i: int) -> int:
        """The longest whole cell (or header) of column ``i``."""
        return max([len(self.columns[i].label)] + [len(row[i]) for row in self.cells])

    def table(self, width: int):
        """The rich Table for ``width`` columns of text."""
        from rich.table import Table

        keep = list(range(len(self.columns)))
        flex = {i for i in keep if self.columns[i].key in ("config", "limit_reason")}
        least = {i: min(self._full(i), self._word(i) if self.columns[i].key == "config" else _MIN_WHY)
                 for i in flex}

        def spare() -> int:  # borders: 2 edges + n - 1 separators; padding 1 + 1 per column
            return (width - (2 + (len(keep) - 1) + 2 * len(keep))
                    - sum(self._word(i) for i in keep if i not in flex))

        dropped = []
        # then, on a very narrow console, the rightmost columns but the configuration and capacity
        order = [*_DROPPABLE, *(self.columns[i].key for i in reversed(keep)
                                if self.columns[i].key not in ("config", "capacity_rps"))]
        for key in order:
            if spare() >= sum(least[i] for i in keep if i in flex):
                break
            idx = next((i for i in keep if self.columns[i].key == key), None)
            if idx is not None:
                keep.remove(idx)
                dropped.append(self.columns[idx].label)
        room = spare() - sum(least[i] for i in keep if i in flex)
        widths = {i: (least[i] if i in flex else self._word(i)) for i in keep}
        # what is left widens, in turn: the configuration to one line, the reason to _WHY,
        # the headers to one line (up to _HEADER each), the reason to one line
        cfg = [i for i in keep if self.columns[i].key == "config"]
        why = [i for i in keep if self.columns[i].key == "limit_reason"]
        wants = [(i, self._full(i)) for i in cfg] + [(i, min(self._full(i), _WHY)) for i in why]
        wants += [(i, max(widths[i], min(self._full(i), _HEADER))) for i in keep if i not in flex]
        wants += [(i, self._full(i)) for i in why]
        for i, want in wants:
            grow = max(0, min(want - widths[i], room))
            widths[i] += grow
            room -= grow
        t = Table(title=self.title)
        if dropped:
            t.caption = f"left out to fit {width} columns: {', '.join(dropped)} (see plan.csv)"
        for i in keep:
            c = self.columns[i]
            t.add_column(c.label, justify="left" if c.kind == "text" else "right", width=widths[i],
                         overflow="fold")
        for row in self.cells:
            t.add_row(*(row[i] for i in keep))
        return t

    def __rich_console__(self, console, options):
        yield self.table(options.max_width)
