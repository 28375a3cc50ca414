"""docs/disaggregation.md's comparison with DistServe's released A100 step times is what
scripts/distserve_profile_check.py gives."""

from __future__ import annotations

import pytest

from tests.script_helpers import ROOT, load_script

DOC = ROOT / "docs" / "disaggregation.md"


@pytest.fixture(scope="module")
def script():
    return load_script("distserve_profile_check")


def test_the_docs_step_table_is_what_the_script_prints(script):
    rows = script.step_rows()
    assert script.markdown_table(rows) in DOC.read_text(encoding="utf-8"), (
        "docs/disaggregation.md's DistServe step table differs from the script's: rerun "
        "python scripts/distserve_profile_check.py and update the section")
    # the verdict the doc states: 9/9 within ±20% of DistServe's fit, 1/9 of vLLM's
    assert [sum(r["within"] for r in rows if r["fit"] == e) for e in ("distserve", "vllm")] == [9, 1]


def test_the_fits_are_read_as_distserve_reads_them(script):
    # time_estimator.py: prefill a + b*sum(n) + c*sum(n^2); decode a + b*sum(context) + c*batch, the set
    # of coefficients switching at the threshold (95 requests)
    a, b, c = script.FITS["distserve"][0]
    assert script.fitted_prefill_ms("distserve", [512]) == pytest.approx(a + b * 512 + c * 512 ** 2)
    a, b, c = script.FITS["distserve"][1]
    assert script.fitted_decode_ms("distserve", 94, 544) == pytest.approx(a + b * 94 * 544 + c * 94)
    a, b, c = script.FITS["distserve"][2]
    assert script.fitted_decode_ms("distserve", 95, 544) == pytest.approx(a + b * 95 * 544 + c * 95)


def test_the_md1_bound_and_littles_law_by_hand(script):
    # the bound for DistServe's fitted 512-token prefill is the doc's
    assert script.md1_p90_rate(script.fitted_prefill_ms("distserve", [512]) / 1e3) == 10.78
    # with D = 0.4 s a 0.4 s P90 needs 90% of requests not to wait; an M/D/1 request waits with
    # probability rho = rate x D, so rate <= 0.1 / 0.4 = 0.25 req/s (the bisection stops 0.005 short)
    assert 0.24 <= script.md1_p90_rate(0.4) <= 0.25
    assert script.md1_p90_rate(0.1) < 10.0
    # Little's law: a step of 20 + b ms, at most 40 ms -> b = 20, 20 / (63 x 0.040 s) = 7.9 req/s
    assert script.decode_only_rate(lambda b: 20.0 + b) == (20, 7.9)
