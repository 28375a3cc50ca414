"""Review 25: metrics with no data are null, not 0."""

from __future__ import annotations

from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import run_scenario


def test_max_itl_is_null_when_no_measured_request_has_a_gap():
    """One-token outputs have no inter-token gap: every ITL statistic is null, the maximum too (it
    read 0.0 from the requests' default)."""
    raw = {"name": "one-token", "model": "llama-3-8b", "hardware": "h100-sxm", "policy": {"name": "continuous"},
           "seed": 1, "workload": {"num_requests": 120, "arrival": {"process": "poisson", "rate": 5},
                                   "prompt_tokens": {"dist": "fixed", "value": 200},
                                   "output_tokens": {"dist": "fixed", "value": 1}}}
    s = run_scenario(scenario_from_dict(raw), keep_steps=False).summary
    assert s["completed"] == 120 and s["mean_itl_ms"] is None and s["max_itl_ms"] is None
    raw["workload"]["output_tokens"] = {"dist": "fixed", "value": 2}
    s = run_scenario(scenario_from_dict(raw), keep_steps=False).summary
    assert s["max_itl_ms"] is not None and s["max_itl_ms"] >= s["p99_itl_ms"] > 0
