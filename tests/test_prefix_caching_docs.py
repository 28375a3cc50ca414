"""docs/prefix-caching.md against the code: the stated default is the code's, the knob is
carried to every compared policy, the hit rate is in the table and the report when a run had a
prefix cache (and only then), and the worked example's numbers are the ones a run gives."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from batchsim.app.compare import KEEP_KNOBS, compare, with_policy, write_comparison
from batchsim.app.config import load_scenario, scenario_from_dict
from batchsim.app.runner import run_scenario
from batchsim.app.summary_table import OFF, PREFIX_ROW, TABLE_ROWS, summary_table
from batchsim.policies.registry import policy_class
from batchsim.policies.step import IterationConfig
from batchsim.reports.html import table_html
from batchsim.reports.tables import SWEEP_COLUMNS, UTILIZATION_COLUMNS
from tests.test_report_html import check_html

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "prefix-caching.md"
KEY = "prefix_cache_hit_rate"
LABEL = PREFIX_ROW[0]

SHARED = {"name": "prefix", "model": "llama-3-8b", "hardware": "h100-sxm",
          "policy": {"name": "chunked_prefill", "max_num_seqs": 64, "enable_prefix_caching": True},
          "workload": {"num_requests": 120, "arrival": {"process": "poisson", "rate": 8.0},
                       "prompt_tokens": {"dist": "uniform", "min": 1200, "max": 2400},
                       "output_tokens": {"dist": "fixed", "value": 20},
                       "shared_prefix": {"groups": 2, "tokens": 1024}},
          "seed": 3}


def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def render(table, width: int = 160) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return " ".join(console.export_text().replace("│", " ").split())  # cells, not borders


def test_the_docs_default_is_the_codes():
    (stated,) = re.findall(r"^batchsim default: `enable_prefix_caching: (true|false)`\.$", doc(), re.M)
    default = IterationConfig.model_fields["enable_prefix_caching"].default
    assert stated == str(default).lower(), "docs/prefix-caching.md states another default than the code"
    # every built-in policy with the knob takes IterationConfig's default
    for name in ("continuous", "chunked_prefill"):
        assert policy_class(name).Config.model_fields["enable_prefix_caching"].default is default
    for name in ("static", "dynamic"):  # the page says they have no prefix cache
        assert "enable_prefix_caching" not in policy_class(name).Config.model_fields
    word = "on" if default else "off"
    assert f"| batchsim | **{word}** |" in doc()
    assert "| vLLM V1 | **on** |" in doc()


def test_the_knob_is_carried_to_every_policy_that_has_it():
    assert "enable_prefix_caching" in KEEP_KNOBS
    for knob in KEEP_KNOBS:
        assert f"`{knob}`" in doc()
    sc = scenario_from_dict(SHARED)
    assert with_policy(sc, "continuous").policy["enable_prefix_caching"] is True
    assert "enable_prefix_caching" not in with_policy(sc, "static").policy


def test_hit_rate_row_only_when_a_run_had_a_prefix_cache():
    on = run_scenario(scenario_from_dict(SHARED)).summary
    off = run_scenario(scenario_from_dict({**SHARED, "policy": {"name": "chunked_prefill", "max_num_seqs": 64}})).summary
    assert 0 < on[KEY] <= 1 and KEY not in off
    text = render(summary_table([on]))
    assert f"{LABEL} {on[KEY]:.1%}" in text
    # a run without a cache beside one with: "off"; no run with one: no row at all
    assert f"{LABEL} {on[KEY]:.1%} {OFF}" in render(summary_table([on, off]))
    assert LABEL not in render(summary_table([off]))
    assert len(TABLE_ROWS) == 15  # the rows every run shows are unchanged
    # the report's tables: a column under the same rule
    assert LABEL in table_html([on, off], UTILIZATION_COLUMNS, "u")
    assert f">{100 * on[KEY]:.1f}%<" in table_html([on], UTILIZATION_COLUMNS, "u")
    assert LABEL not in table_html([off], UTILIZATION_COLUMNS, "u")
    assert LABEL not in table_html([{**off, "rate": 8.0}], SWEEP_COLUMNS, "s")
    assert LABEL in table_html([{**on, "rate": 8.0}], SWEEP_COLUMNS, "s")


def test_compare_report_shows_the_hit_rate_of_each_policy(tmp_path):
    sc = scenario_from_dict(SHARED)
    comp = compare(sc, ["static", "continuous", "chunked_prefill"], seeds=1, executor="serial", show_progress=False)
    rates = {s["policy"]: s.get(KEY) for s in comp.summaries}
    assert rates["static"] is None and rates["continuous"] > 0 and rates["chunked_prefill"] > 0
    text = render(summary_table(comp.summaries))
    assert f"{LABEL} {OFF} {rates['continuous']:.1%} {rates['chunked_prefill']:.1%}" in text
    html = write_comparison(comp, tmp_path)["report.html"].read_text(encoding="utf-8")
    check_html(html)
    util = html[html.index('id="utilization"'):]
    util = util[:util.index("</table>")]
    assert LABEL in util and f">{OFF}<" in util and f">{100 * rates['continuous']:.1f}%<" in util


def test_the_worked_example_numbers_are_measured():
    text = doc()
    sets = ["workload.shared_prefix.groups=4", "workload.shared_prefix.tokens=2048"]
    for s in sets + ["policy.enable_prefix_caching=true"]:
        assert f"--set {s}" in text
    path = ROOT / "examples" / "chunked_prefill.yaml"
    off = run_scenario(load_scenario(path, sets), path.parent).summary
    on = run_scenario(load_scenario(path, sets + ["policy.enable_prefix_caching=true"]), path.parent).summary

    def ms(s, key):
        return f"{s[f'median_{key}_ms']:.1f} / {s[f'p99_{key}_ms']:.1f}"

    assert f"| prefix cache hit rate | off | {on[KEY]:.1%} |" in text
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2E")):
        assert f"| {label} p50 / p99 (ms) | {ms(off, key)} | {ms(on, key)} |" in text
    assert f"| peak KV usage | {off['peak_kv_usage']:.1%} | {on['peak_kv_usage']:.1%} |" in text
    assert f"| engine | {off['engine']} | {on['engine']} |" in text


@pytest.mark.parametrize("path", ["vllm/config/cache.py", "vllm/engine/arg_utils.py",
                                  "vllm/v1/core/kv_cache_manager.py", "vllm/v1/metrics/stats.py"])
def test_the_vllm_sources_are_named(path):
    assert f"`{path}`" in doc()


def test_a_summary_over_seeds_shows_each_metric_with_its_interval():
    from rich.console import Console

    from batchsim.app.summary_table import summary_table

    base = {"policy": "p", "completed": 99.5, "rejected": 0.0, "unfinished": 0.0, "request_throughput": 3.2,
            "output_throughput": 1000.0, "request_goodput": None, "median_ttft_ms": 66.6, "p99_ttft_ms": 495.9,
            "median_tpot_ms": 1.0, "p99_tpot_ms": 2.0, "median_itl_ms": 1.0, "p99_itl_ms": 1.0, "max_itl_ms": 3.0,
            "median_e2el_ms": 1.0, "p99_e2el_ms": 1.0, "busy_fraction": 0.99, "mfu": 0.2, "mbu": 0.5,
            "token_efficiency": 1.0, "mean_batch_size": 4.0, "peak_kv_usage": 0.3, "preemptions": 0, "engine": "core"}
    seeded = {**base, "p99_ttft_ms_ci95": 40.3, "request_throughput_ci95": 0.1, "busy_fraction_ci95": 0.01}
    console = Console(width=200, record=True)
    console.print(summary_table([base, seeded]))
    text = console.export_text()
    assert "66.6 / 495.9 ± 40.3" in text and "3.20 ± 0.10" in text and "99.0% ± 1.0%" in text
    assert "99.5 / 0 / 0" in text
