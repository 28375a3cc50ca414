"""Regression diffs: which metric got worse, by how much, and how to show it.

This module is pure: it compares two flat ``{metric: number}`` mappings (a
baseline's and a fresh run's summary) and renders the result three ways — a
terminal table, JUnit XML (one test case per scenario x metric, for CI test
viewers) and a markdown summary sized for a pull-request comment. Running the
scenarios and reading the baseline file is :mod:`batchsim.app.regress`'s job.

Every metric has a direction. Latencies (``*_ms``) and failure counts are
better lower, throughputs, goodput and ``completed`` are better higher; a
metric with no natural direction (``num_steps``, ``busy_fraction``) is
``either``: any change beyond tolerance fails. A value moves *beyond
tolerance* when ``|current - baseline| > max(rtol * |baseline|, atol)``:
``rtol`` is the user's knob, ``atol`` a per-metric floor so that values near
zero (0 rejected requests, an idle system's ITL) do not flap.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping

from rich.markup import escape
from rich.table import Table

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


# NOTE: the absolute floors are deliberately small. The simulator is
# deterministic, so there is no run-to-run noise to absorb; the floors only
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
    """One metric of one scenario: both values, the allowed band and the verdict."""

    metric: str
    baseline: float | None
    current: float | None
    tolerance: float
    better: Better
    status: str  # ok | improved | regressed | changed | missing | unavailable | not evaluable | new (by --update)

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    @property
    def change(self) -> float | None:
        """Relative change (current / baseline - 1); None when undefined."""
        if self.baseline is None or self.current is None or self.baseline == 0:
            return None
        return self.current / self.baseline - 1.0

    def describe(self) -> str:
        """``p99_ttft_ms: 120.1 -> 150.3 (+25.1%, tolerance ±2.402, lower is better)``."""
        if self.status == "missing":
            return f"{self.metric}: not in the baseline (current {fmt(self.current)})"
        if self.status == "unavailable":
            return f"{self.metric}: not in this run's summary (baseline {fmt(self.baseline)})"
        if self.status == "not evaluable":
            where = " and ".join(w for w, v in (("the baseline", self.baseline), ("this run", self.current))
                                 if v is None)
            return (f"{self.metric}: null in {where} (no measured request has it): not evaluable, so not a pass "
                    f"(baseline {fmt(self.baseline)}, current {fmt(self.current)})")
        return (f"{self.metric}: {fmt(self.baseline)} -> {fmt(self.current)} ({fmt_change(self)}, "
                f"tolerance ±{fmt(self.tolerance)}, {self.better} is better)"
                if self.better != "either" else
                f"{self.metric}: {fmt(self.baseline)} -> {fmt(self.current)} ({fmt_change(self)}, "
                f"tolerance ±{fmt(self.tolerance)}, any change counts)")


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


def compare(baseline: Mapping[str, float] | None, current: Mapping[str, float],
            metrics: Iterable[str], rtol: float) -> tuple[MetricDiff, ...]:
    """Diff ``current`` against ``baseline`` for each metric (baseline None: all missing).

    A metric present but null (None or NaN: no measured request had it) on
    either side is ``not evaluable``, a failure: it is neither equal nor better.
    """
    out = []
    for key in metrics:
        spec = metric_spec(key)
        base = _number(baseline.get(key)) if baseline is not None else None
        cur = _number(current.get(key))
        tol = max(rtol * abs(base), spec.atol) if base is not None else spec.atol
        null = _null(current, key) or (baseline is not None and _null(baseline, key))
        status = "not evaluable" if null else _status(spec, base, cur, tol)
        out.append(MetricDiff(key, base, cur, tol, spec.better, status))
    return tuple(out)


def _null(values: Mapping, key: str) -> bool:
    """``key`` is there but has no value (None, NaN)."""
    if key not in values:
        return False
    v = values[key]
    return v is None or (isinstance(v, float) and math.isnan(v))


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _status(spec: MetricSpec, base: float | None, cur: float | None, tol: float) -> str:
    if base is None:
        return "missing"
    if cur is None:
        return "unavailable"
    delta = cur - base
    if abs(delta) <= tol:
        return "ok"
    if spec.better == "either":
        return "changed"
    worse = delta > 0 if spec.better == "lower" else delta < 0
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


def fmt_change(d: MetricDiff) -> str:
    c = d.change
    if c is None:
        return "n/a" if d.baseline is None or d.current is None else f"{d.current - d.baseline:+g}"
    return f"{c:+.1%}"


_STYLE = {"ok": "green", "improved": "cyan", "regressed": "bold red", "changed": "bold red",
          "missing": "bold yellow", "unavailable": "bold yellow", "not evaluable": "bold red", "new": "cyan"}


def diff_table(report: RegressionReport, only_changes: bool = False) -> Table:
    """A rich table, one row per scenario x metric (``only_changes``: hide ``ok`` rows)."""
    t = Table(title=f"batchsim regress vs {report.baseline} (rtol {report.rtol:g})")
    for col, just in (("scenario", "left"), ("metric", "left"), ("baseline", "right"),
                      ("current", "right"), ("change", "right"), ("tolerance", "right"),
                      ("status", "left")):
        t.add_column(col, justify=just, no_wrap=col != "scenario")
    for s in report.scenarios:
        for d in s.diffs:
            if only_changes and d.status == "ok":
                continue
            t.add_row(escape(s.key), d.metric, fmt(d.baseline), fmt(d.current), fmt_change(d),
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
                            ("baseline_hash", s.baseline_hash), ("rtol", f"{report.rtol:g}")):
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
            elif d.status == "improved" or s.notes:
                out = ET.SubElement(case, "system-out")
                out.text = "\n".join(([f"improved: {d.describe()}"] if d.status == "improved" else [])
                                     + list(s.notes))
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
    lines = ["| scenario | metric | baseline | current | change | tolerance |",
             "|---|---|--:|--:|--:|--:|"]
    for s, d in pairs:
        lines.append(f"| `{_md_cell(s.key)}` | `{d.metric}` | {fmt(d.baseline)} | {fmt(d.current)} "
                     f"| {fmt_change(d)} | ±{fmt(d.tolerance)} |")
    return lines


def _headline(report: RegressionReport) -> str:
    n_s, n_m = len(report.scenarios), sum(len(s.diffs) for s in report.scenarios)
    bad = report.rows(*FAILING)
    broken = [s for s in report.scenarios if s.problems]
    size = f"{n_s} scenario{'s' * (n_s != 1)}, {n_m} checks, rtol {report.rtol:g}"
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
