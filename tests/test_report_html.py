"""The report folder from hand-built records: files, plot series, self-contained HTML.

``check_html`` (also used by test_compare.py) parses the page with the
standard library and asserts it is well-formed, references only embedded
images and contains no URL a browser could fetch.
"""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from matplotlib.container import BarContainer

from batchsim.reports import plots
from batchsim.reports.report import COMPARE_FIGURES, write_compare_report
from batchsim.reports.runs import ReportInfo
from tests.test_report_records import hand_runs

VOID = {"meta", "img", "br", "hr", "link", "input", "source", "wbr", "col", "area", "base"}
PNG = b"\x89PNG\r\n\x1a\n"


class _Checker(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.images: list[str] = []
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        for name in ("href", "src", "action", "srcset", "poster", "data"):
            v = a.get(name)
            if v is not None and not (tag == "img" and name == "src" and v.startswith("data:image/png;base64,")):
                self.errors.append(f"<{tag} {name}={v[:40]!r}>: not an embedded image")
        if tag == "img":
            self.images.append(a.get("src", ""))
            if not a.get("alt"):
                self.errors.append("img without alt text")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}>")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def check_html(text: str) -> _Checker:
    """Assert well-formed, self-contained HTML; return the parse for more checks."""
    assert text.startswith("<!DOCTYPE html>")
    c = _Checker()
    c.feed(text)
    c.close()
    assert not c.errors, c.errors[:5]
    assert c.stack == [], f"unclosed: {c.stack}"
    assert "link" not in c.tags and "iframe" not in c.tags
    lowered = text.lower()
    assert "http://" not in lowered and "https://" not in lowered
    assert not re.search(r"url\s*\(", lowered), "CSS must not load anything"
    assert not re.search(r"<script[^>]*\bsrc=", lowered)
    for src in c.images:
        png = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert png.startswith(PNG)
    return c


def assert_png_not_blank(data: bytes) -> None:
    assert data.startswith(PNG) and len(data) > 5000
    img = matplotlib.image.imread(io.BytesIO(data), format="png")
    assert img.shape[0] > 200 and img.shape[1] > 400
    assert float(np.std(img[..., :3])) > 0.02  # not a blank canvas


def policy_labels(ax) -> list[str]:
    """Labels of the policy series in one panel (lines and bar groups)."""
    lines = [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    bars = [c.get_label() for c in ax.containers if isinstance(c, BarContainer)]
    return lines + bars


def assert_one_series_per_policy(fig, policies, skip_axes=(), per_panel=False) -> None:
    """Every panel has one series per policy; with ``per_panel`` (a column of
    panels per policy) every panel has one series and each policy its panels."""
    axes = [ax for i, ax in enumerate(fig.axes) if i not in skip_axes]
    assert axes
    if per_panel:
        labels = [policy_labels(ax) for ax in axes]
        assert all(len(x) == 1 for x in labels), labels
        counts = {p: sum(x == [p] for x in labels) for p in policies}
        assert set(counts.values()) == {len(axes) // len(policies)}, counts
    for ax in axes:
        if not per_panel:
            assert sorted(policy_labels(ax)) == sorted(policies), (ax.get_title(), policy_labels(ax))
        assert ax.get_ylabel() or ax.get_xlabel() or per_panel, "an axis label with its unit"
        assert ax.get_title() or ax.get_title(loc="left") or per_panel, "a panel title"
    assert any(ax.get_xlabel() for ax in fig.axes)


INFO = ReportInfo(title="batchsim compare: <script>alert('x')</script>", scenario="evil <b>&\"'",
                  model="llama<3>", hardware="h100", calibrated=False, version="0.1.0",
                  details=(("workload", "a <i>b</i>"),))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("hand")
    files = write_compare_report(out, hand_runs(), INFO, ["static(max_batch_size=8)", "continuous()"])
    return out, files


def test_every_file_is_written_and_plots_are_not_blank(report):
    out, files = report
    assert set(files) == {"summary.csv", "report.html"} | {f[0] for f in COMPARE_FIGURES}
    for name, _, _, _, _ in COMPARE_FIGURES:
        assert_png_not_blank((out / name).read_bytes())
    assert not (out / "runs.csv").exists()  # one seed: no per-seed file


def test_html_is_well_formed_self_contained_and_escaped(report):
    out, _ = report
    text = (out / "report.html").read_text(encoding="utf-8")
    c = check_html(text)
    assert len(c.images) == len(COMPARE_FIGURES)
    assert "<script>alert" not in text and "&lt;script&gt;alert(&#x27;x&#x27;)" in text
    assert "evil &lt;b&gt;&amp;&quot;&#x27;" in text and "a &lt;i&gt;b&lt;/i&gt;" in text
    assert c.tags.count("script") == 1  # only the inline sorter
    assert 'class="sortable"' in text and "aria-sort" in text
    assert "uncalibrated" in text and "0.1.0" in text


@pytest.mark.parametrize("builder", [f[1] for f in COMPARE_FIGURES])
def test_every_plot_has_one_series_per_policy(builder):
    runs = hand_runs(names=("static", "dynamic", "my:Policy"))
    fig = builder(runs)
    # token_efficiency's left panel stacks token kinds; its right panel is per policy
    skip = (0,) if builder is plots.token_efficiency else ()
    assert_one_series_per_policy(fig, [r.policy for r in runs], skip, builder is plots.timelines)


def test_seeds_give_error_bars_ci_cells_and_runs_csv(tmp_path, monkeypatch):
    import batchsim.reports.report

    # NOTE: PNG rendering is what is slow and the first fixture already checks it.
    monkeypatch.setattr(batchsim.reports.report, "png_bytes", lambda fig: PNG + b"stub")
    runs = hand_runs(seeds=3)
    files = write_compare_report(tmp_path, runs, ReportInfo("t", "s", "m", "h", True, "0.1.0", seeds=3))
    assert "runs.csv" in files
    lines = (tmp_path / "runs.csv").read_text().splitlines()
    assert lines[0].startswith("seed_index,policy,") and len(lines) == 1 + 2 * 3
    text = (tmp_path / "report.html").read_text()
    check_html(text)
    assert '<span class="ci">± ' in text and "calibrated</span>" in text
    fig = plots.latency_percentiles(runs)
    ttft_axis = fig.axes[0]
    assert any(len(c.lines) > 1 and c.has_yerr for c in ttft_axis.containers if hasattr(c, "has_yerr"))


def test_summary_csv_is_stable_text(report):
    out, _ = report
    text = (out / "summary.csv").read_text()
    assert text.splitlines()[0] == "policy,completed,median_ttft_ms,p99_ttft_ms,token_efficiency"
    assert text.splitlines()[1] == "static,3,200,600,0.9"
    assert Path(out / "summary.csv").read_bytes().endswith(b"\n")
