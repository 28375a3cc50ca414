"""docs/disaggregation.md's comparison with Splitwise's measured phases is what scripts/splitwise_check.py gives."""

from __future__ import annotations

import pytest

from tests.script_helpers import ROOT, load_script

DOC = ROOT / "docs" / "disaggregation.md"


@pytest.fixture(scope="module")
def script():
    return load_script("splitwise_check")


@pytest.fixture(scope="module")
def rows(script):
    return script.rows()  # (every measured point: a few seconds)


def test_the_docs_summary_is_what_the_script_prints(script, rows):
    assert script.markdown_table(rows) in DOC.read_text(encoding="utf-8"), (
        "docs/disaggregation.md's Splitwise table differs from the script's: rerun "
        "python scripts/splitwise_check.py --markdown and update the section and its prose")


def test_every_measured_point_is_compared_once_and_only_the_inconsistent_ones_are_left_out(script, rows):
    keys = [(r["hardware"], r["tp"], r["series"], r["x"]) for r in rows]
    assert len(keys) == len(set(keys)) == 6 * (7 + 6 + 7)
    assert {k for k, r in zip(keys, rows) if r["excluded"]} == script.EXCLUDED
    assert all(r["completed"] == (1 if r["series"] == "ttft" else r["x"]) for r in rows)
    # the verdict the doc states: 20 of 116 judged points within ±20%
    judged = [r for r in rows if not r["excluded"]]
    assert (sum(r["within"] for r in judged), len(judged)) == (20, 116)
    assert script.summary(rows)[-1].endswith("NOT REPRODUCED")


def test_a_batch_is_prefilled_in_one_step(script, tmp_path):
    # the mapping: every request of a batch is queued before the first step, so they share one prompt
    # phase (arrivals 1 ns apart started the first prompt alone, the rest a step later)
    from batchsim.app.config import scenario_from_dict
    from batchsim.app.runner import build_parts, simulate

    sc = scenario_from_dict(script.scenario(script._model_file(tmp_path), "a100-80gb", 2, 4, 512, 3), "t")
    req = simulate(sc, build_parts(sc)).requests
    assert (req["admitted"] == 0).all() and req["ttft"].nunique() == 1 and req["tpot"].nunique() == 1
    model = script._model_file(tmp_path)
    assert script.run_point(model, "h100-sxm", 8, 4, 512, 8) == script.run_point(model, "h100-sxm", 8, 4, 512, 8)
