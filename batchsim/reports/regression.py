"""Regression diffs: which metric got worse, by how much, and how to show it.

This module is pure: it compares two flat ``{metric: number}`` mappings (a
baseline's and a fresh run's summary) and renders the result three ways — a
terminal table, JUnit XML (one test case per scenario x metric, for CI test
viewers) and a markdown summary sized for a pull-request comment. Running the
scenarios and reading the baseline file is :mod:`batchsim.app.regress`'s job.

Every metric has a direction. Latencies (``*_ms``) and failure counts are
better lower, throughputs, goodput and ``completed`` are better higher; a
metric with no natural direction (``num_steps``, ``busy_fraction``) is
``either``: any change beyond tolerance fails.

Each side holds one value per seed. The verdict compares 95% t-intervals
for the two means (:func:`batchsim.reports.stats.mean_ci`, the one compare's
``*_ci95`` columns use): with ``tol = max(rtol * |baseline mean|, atol)``, a
lower-is-better metric *regresses* when the new interval's lower bound lies
above the baseline interval's upper bound by more than ``tol``
(``new_lo > base_hi + tol``), and *improves* when its upper bound lies below
the baseline's lower bound by more than ``tol``; higher-is-better is the
mirror image; otherwise it is ``ok``. One value on a side (``--seeds 1``, or
an old one-seed baseline) is an interval of zero width. ``rtol`` is the
user's knob, ``atol`` a per-metric floor so that values near zero (0
rejected requests, an idle system's ITL) do not flap.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping, Sequence, Union

from rich.markup import escape
from rich.table import Table

from batchsim.reports.stats import mean_ci

__all__ = ["MetricSpec", "MetricDiff", "ScenarioDiff", "RegressionReport", "DEFAULT_METRICS",
           "FAILING", "metric_spec", "compare", "diff_table", "to_junit", "to_markdown",
           "COMMENT_MARKER"]

Better = Literal["lower", "higher", "either"]
FAILING = ("regressed", "changed", "missing", "unavailable", "not evaluable")
"""Statuses that fail the gate; ``ok`` and ``improved`` pass."""

COMMENT_MARKER = "<!-- batchsim-regress -->"
"""First line of the markdown summary, so a CI job can find and update its own PR comment."""


@dataclass(frozen=True)
class MetricSpec:
    """How to judge one summary key: which way is better and its absolute floor."""

    key: str
    better: Better
    atol: float


# NOTE: the absolute floors are deliberately small. Seed-to-seed noise is
# absorbed by the intervals (a run is deterministic per seed); the floors only
# stop a relative tolerance from collapsing to zero when the baseline is ~0.
_LATENCY_ATOL_MS = 0.1
_COUNT_ATOL = 0.5  # a count must move by at least one request
_RATE_ATOL = 0.01  # req/s

DEFAULT_METRICS: tuple[str, ...] = (
    "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
    "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms",
    "output_throughput", "request_throughput", "request_goodput",
    "completed", "rejected",
)
"""What ``batchsim regress`` checks unless ``--metrics`` says otherwise (vLLM bench names)."""

_KNOWN: dict[str, tuple[Better, float]] = {
    "output_throughput": ("higher", 1.0),
    "total_token_throughput": ("higher", 1.0),
    "request_throughput": ("higher", _RATE_ATOL),
    "request_goodput": ("higher", _RATE_ATOL),
    "completed": ("higher", _COUNT_ATOL),
    "rejected": ("lower", _COUNT_ATOL),
    "unfinished": ("lower", _COUNT_ATOL),
    "preemptions": ("lower", _COUNT_ATOL),
    "out_of_range_ops": ("lower", _COUNT_ATOL),
    "mfu": ("higher", 1e-4),
    "mbu": ("higher", 1e-4),
    "token_efficiency": ("higher", 1e-4),
}


def metric_spec(key: str) -> MetricSpec:
    """The spec for a summary key: known table first, then ``*_ms`` latencies, else ``either``."""
    if key in _KNOWN:
        better, atol = _KNOWN[key]
        return MetricSpec(key, better, atol)
    if key.endswith("_ms"):
        return MetricSpec(key, "lower", _LATENCY_ATOL_MS)
    return MetricSpec(key, "either", 1e-9)


@dataclass(frozen=True)
class MetricDiff:
    """One metric of one scenario: both means and 95% intervals, the allowed band and the verdict.

    ``baseline``/``current`` are means over seeds; ``baseline_ci``/``current_ci``
    the half-widths of their 95% t-intervals (0.0 for a single seed);
    ``baseline_n``/``current_n`` how many seeds each holds.
    """

    metric: str
    baseline: float | None
    current: float | None
    tolerance: float
    better: Better
    status: str  # ok | improved | regressed | changed | missing | unavailable | not evaluable | new (by --update)
    baseline_ci: float = 0.0
    current_ci: float = 0.0
    baseline_n: int = 1
    current_n: int = 1

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    @property
    def change(self) -> float | None:
        """Relative change (current / baseline - 1); None when undefined."""
        if self.baseline is None or self.current is None or self.baseline == 0:
            return None
        return self.current / self.baseline - 1.0

    @property
    def baseline_text(self) -> str:
        """``120.1 ± 3.2`` (mean ± 95% CI half-width); a single seed shows its value alone."""
        return fmt_ci(self.baseline, self.baseline_ci, self.baseline_n)

    @property
    def current_text(self) -> str:
        return fmt_ci(self.current, self.current_ci, self.current_n)

    def describe(self) -> str:
        """``p99_ttft_ms: 120.1 ± 3.2 -> 150.3 ± 4.0 (+25.1%, tolerance ±2.402, lower is better)``."""
        if self.status == "missing":
            return f"{self.metric}: not in the baseline (current {self.current_text})"
        if self.status == "unavailable":
            return f"{self.metric}: not in this run's summary (baseline {self.baseline_text})"
        if self.status == "not evaluable":
            where = " and ".join(w for w, v in (("the baseline", self.baseline), ("this run", self.current))
                                 if v is None)
            return (f"{self.metric}: null in {where} (no measured request has it): not evaluable, so not a pass "
                    f"(baseline {fmt(self.baseline)}, current {fmt(self.current)})")
        how = f"{self.better} is better" if self.better != "either" else "any change counts"
        return (f"{self.metric}: {self.baseline_text} -> {self.current_text} ({fmt_change(self)}, "
                f"tolerance ±{fmt(self.tolerance)}, {how})")


@dataclass(frozen=True)
class ScenarioDiff:
    """All metric diffs of one scenario, plus scenario-level problems and notes.

    ``problems`` fail the scenario on their own (its inputs changed since the
    baseline, or it has no baseline entry); ``notes`` only inform (a
    different batchsim version recorded the baseline).
    """

    key: str
    name: str
    diffs: tuple[MetricDiff, ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    scenario_hash: str = ""
    baseline_hash: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return bool(self.problems) or any(d.failed for d in self.diffs)


@dataclass(frozen=True)
class RegressionReport:
    """The outcome of one ``batchsim regress`` invocation."""

    scenarios: tuple[ScenarioDiff, ...]
    rtol: float
    baseline: str
    updated: bool = False
    notes: tuple[str, ...] = ()
    seeds: int = 1

    @property
    def failed(self) -> bool:
        """True when the gate fails (never after ``--update``, which accepts the new values)."""
        return not self.updated and any(s.failed for s in self.scenarios)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def rows(self, *statuses: str) -> list[tuple[ScenarioDiff, MetricDiff]]:
        """(scenario, diff) pairs whose status is one of ``statuses``, in run order."""
        return [(s, d) for s in self.scenarios for d in s.diffs if d.status in statuses]


Values = Union[float, int, None, Sequence[Union[float, int, None]]]
"""One metric on one side: a value per seed (a bare number is one seed)."""


def compare(baseline: Mapping[str, Values] | None, current: Mapping[str, Values],
            metrics: Iterable[str], rtol: float, paired: bool = False) -> tuple[MetricDiff, ...]:
    """Diff ``current`` against ``baseline`` for each metric (baseline None: all missing).

    Each value is a list of per-seed values or a bare number (one seed). The
    verdict compares the two 95% intervals of the mean (see the module
    docstring). A metric present but null (None or NaN: no measured request
    had it) in any seed on either side is ``not evaluable``, a failure: it
    is neither equal nor better.
    """
    out = []
    for key in metrics:
        spec = metric_spec(key)
        base = _interval(baseline.get(key)) if baseline is not None else None
        cur = _interval(current.get(key))
        tol = max(rtol * abs(base[0]), spec.atol) if base is not None else spec.atol
        null = _null(current, key) or (baseline is not None and _null(baseline, key))
        if null:
            status = "not evaluable"
        elif paired and base is not None and cur is not None and base[2] == cur[2]:
            status = _paired_status(spec, baseline.get(key), current.get(key), tol)
        else:
            status = _status(spec, base, cur, tol)
        b_mean, b_ci, b_n = base or (None, 0.0, len(_seq(baseline.get(key))) if baseline else 0)
        c_mean, c_ci, c_n = cur or (None, 0.0, len(_seq(current.get(key))))
        out.append(MetricDiff(key, b_mean, c_mean, tol, spec.better, status, b_ci, c_ci, b_n, c_n))
    return tuple(out)


def _seq(v: object) -> list:
    """A side's per-seed values as a list (a bare value is one seed, absent is none)."""
    if v is None:
        return []
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _interval(v: object) -> tuple[float, float, int] | None:
    """``(mean, 95% CI half-width, seeds)``; None when any seed's value is not a number.

    The half-width is 0.0 for one seed: a single run is taken at its value.
    """
    values = [_number(x) for x in _seq(v)]
    if not values or any(x is None for x in values):
        return None
    mean, ci = mean_ci(values)
    return mean, (0.0 if math.isnan(ci) else ci), len(values)


def _null(values: Mapping, key: str) -> bool:
    """``key`` is there but has no value (None, NaN) in some seed."""
    if key not in values:
        return False
    vs = _seq(values[key])
    return not vs or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in vs)


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _paired_status(spec: MetricSpec, base: Values, cur: Values, tol: float) -> str:
    """The verdict from the seed-by-seed differences (common random numbers: each seed's
    workload is the same on both sides, so the differences carry the change, not the
    workload's noise): regressed when the 95% interval of the mean difference lies beyond
    the tolerance in the bad direction, or when every seed (at least 5) moved beyond it that way."""
    d = [c - b for b, c in zip((_number(x) for x in _seq(base)), (_number(x) for x in _seq(cur)))]
    mean, ci = mean_ci(d)
    ci = 0.0 if math.isnan(ci) else ci
    # either the interval of the mean difference lies beyond the tolerance, or every seed moved
    # beyond it the same way (a sign test: with 5 seeds, 1 chance in 32 for a change that is
    # neutral; it catches a consistent change whose size varies from seed to seed)
    up = mean - ci > tol or (len(d) >= 5 and all(x > tol for x in d))
    down = -(mean + ci) > tol or (len(d) >= 5 and all(-x > tol for x in d))
    return _verdict(spec, up, down)


def _status(spec: MetricSpec, base: tuple[float, float, int] | None,
            cur: tuple[float, float, int] | None, tol: float) -> str:
    if base is None:
        return "missing"
    if cur is None:
        return "unavailable"
    (b, b_ci, _), (c, c_ci, _) = base, cur
    up = (c - c_ci) - (b + b_ci) > tol      # the new interval lies above the baseline's
    down = (b - b_ci) - (c + c_ci) > tol    # ... or below it
    return _verdict(spec, up, down)


def _verdict(spec: MetricSpec, up: bool, down: bool) -> str:
    """ok, changed, regressed or improved, from whether the metric moved up or down beyond noise."""
    if not (up or down):
        return "ok"
    if spec.better == "either":
        return "changed"
    worse = up if spec.better == "lower" else down
    return "regressed" if worse else "improved"


# ------------------------------------------------------------------ rendering


def fmt(v: float | None) -> str:
    """Compact, stable number formatting for tables and messages."""
    if v is None:
        return "—"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    a = abs(v)
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.3f}"
    return f"{v:.4g}"


def fmt_ci(mean: float | None, ci: float, n: int) -> str:
    """``mean ± ci`` for several seeds, the bare value for one (or none)."""
    if mean is None or n < 2:
        return fmt(mean)
    return f"{fmt(mean)} ± {fmt(ci)}"


def fmt_change(d: MetricDiff) -> str:
    c = d.change
    if c is None:
        return "n/a" if d.baseline is None or d.current is None else f"{d.current - d.baseline:+g}"
    return f"{c:+.1%}"


_STYLE = {"ok": "green", "improved": "cyan", "regressed": "bold red", "changed": "bold red",
          "missing": "bold yellow", "unavailable": "bold yellow", "not evaluable": "bold red", "new": "cyan"}


def diff_table(report: RegressionReport, only_changes: bool = False) -> Table:
    """A rich table, one row per scenario x metric (``only_changes``: hide ``ok`` rows)."""
    t = Table(title=f"batchsim regress vs {report.baseline} (rtol {report.rtol:g}, "
                    f"{report.seeds} seed{'s' * (report.seeds != 1)}, mean ± 95% CI)")
    for col, just in (("scenario", "left"), ("metric", "left"), ("baseline", "right"),
                      ("current", "right"), ("change", "right"), ("tolerance", "right"),
                      ("status", "left")):
        t.add_column(col, justify=just, no_wrap=col != "scenario")
    for s in report.scenarios:
        for d in s.diffs:
            if only_changes and d.status == "ok":
                continue
            t.add_row(escape(s.key), d.metric, d.baseline_text, d.current_text, fmt_change(d),
                      f"±{fmt(d.tolerance)}", f"[{_STYLE[d.status]}]{d.status}[/]")
    return t


def to_junit(report: RegressionReport) -> str:
    """JUnit XML: a testsuite per scenario, a testcase per scenario x metric.

    A failing case's ``<failure>`` message names the scenario, the metric and
    both values. Scenario-level problems (changed inputs, no baseline entry)
    fail every case of the scenario, since none of its comparisons is valid.
    """
    root = ET.Element("testsuites", name="batchsim regress")
    total = failures = 0
    for s in report.scenarios:
        suite = ET.SubElement(root, "testsuite", name=s.key, time=f"{s.seconds:.3f}")
        props = ET.SubElement(suite, "properties")
        for name, value in (("scenario_name", s.name), ("scenario_hash", s.scenario_hash),
                            ("baseline_hash", s.baseline_hash), ("rtol", f"{report.rtol:g}"),
                            ("seeds", str(report.seeds))):
            ET.SubElement(props, "property", name=name, value=value)
        n_fail = 0
        for d in s.diffs:
            case = ET.SubElement(suite, "testcase", classname=s.key, name=d.metric, time="0")
            if not report.updated and (d.failed or s.problems):
                n_fail += 1
                kind = d.status if d.failed else "scenario-changed"
                msg = f"{s.key}: {d.describe()}"
                if s.problems:
                    msg += " [" + "; ".join(s.problems) + "]"
                fail = ET.SubElement(case, "failure", type=kind, message=msg)
                fail.text = "\n".join((msg, *s.problems, *s.notes))
            else:  # the intervals of a passing case too: baseline mean ± CI -> current mean ± CI
                out = ET.SubElement(case, "system-out")
                out.text = "\n".join([f"{d.status}: {d.describe()}", *s.notes])
        suite.set("tests", str(len(s.diffs)))
        suite.set("failures", str(n_fail))
        suite.set("errors", "0")
        suite.set("skipped", "0")
        total += len(s.diffs)
        failures += n_fail
    root.set("tests", str(total))
    root.set("failures", str(failures))
    root.set("errors", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_rows(pairs: list[tuple[ScenarioDiff, MetricDiff]]) -> list[str]:
    lines = ["| scenario | metric | baseline (mean ± 95% CI) | current (mean ± 95% CI) | change | tolerance |",
             "|---|---|--:|--:|--:|--:|"]
    for s, d in pairs:
        lines.append(f"| `{_md_cell(s.key)}` | `{d.metric}` | {d.baseline_text} | {d.current_text} "
                     f"| {fmt_change(d)} | ±{fmt(d.tolerance)} |")
    return lines


def _headline(report: RegressionReport) -> str:
    n_s, n_m = len(report.scenarios), sum(len(s.diffs) for s in report.scenarios)
    bad = report.rows(*FAILING)
    broken = [s for s in report.scenarios if s.problems]
    size = (f"{n_s} scenario{'s' * (n_s != 1)}, {n_m} checks, rtol {report.rtol:g}, "
            f"{report.seeds} seed{'s' * (report.seeds != 1)}")
    if report.updated:
        return f"## batchsim regress: baseline updated ({size})"
    if not report.failed:
        return f"## batchsim regress: :white_check_mark: no regressions ({size})"
    parts = []
    if bad:
        parts.append(f"{len(bad)} failing metric{'s' * (len(bad) != 1)}")
    if broken:
        parts.append(f"{len(broken)} scenario{'s' * (len(broken) != 1)} changed, new or not evaluable")
    return f"## batchsim regress: :x: {', '.join(parts)} ({size})"


def to_markdown(report: RegressionReport) -> str:
    """A pull-request comment: headline, problems, regressions, improvements, full table folded."""
    lines = [COMMENT_MARKER, _headline(report), ""]
    problems = [(s, p) for s in report.scenarios for p in s.problems]
    notes = list(report.notes) + [f"`{s.key}`: {n}" for s in report.scenarios for n in s.notes]
    if problems:
        lines += ["### Scenario problems", ""]
        lines += [f"- `{_md_cell(s.key)}`: {_md_cell(p)}" for s, p in problems] + [""]
    bad = report.rows(*FAILING)
    if bad:
        lines += ["### Regressions" if not report.updated else "### Worse than the old baseline", ""]
        lines += _md_rows(bad) + [""]
    good = report.rows("improved")
    if good:
        lines += ["### Improvements", ""] + _md_rows(good) + [""]
    if notes:
        lines += ["### Notes", ""] + [f"- {_md_cell(n)}" for n in notes] + [""]
    lines += ["<details><summary>All metrics</summary>", ""]
    lines += _md_rows([(s, d) for s in report.scenarios for d in s.diffs])
    lines += ["", "</details>", ""]
    if report.failed:
        lines += ["If the change is intended, re-record the baseline with "
                  f"`batchsim regress ... --baseline {report.baseline} --update` and commit it.", ""]
    return "\n".join(lines)
