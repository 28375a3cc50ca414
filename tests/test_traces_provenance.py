"""A run's provenance names what decided its arrival times: the trace's own times, or the arrival process."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import run_scenario

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"


def _provenance(workload: dict) -> dict:
    sc = scenario_from_dict({"name": "prov", "model": "llama-3-8b", "hardware": "h100-sxm", "seed": 1,
                             "policy": {"name": "continuous"}, "workload": workload})
    return run_scenario(sc, FIXTURES, keep_steps=False).summary["provenance"]


LENGTHS = {"format": "lengths", "path": "lengths_small.csv"}
BENCH = {"format": "vllm_bench", "path": "vllm_bench_small.json", "arrivals_from": "arrival"}


@pytest.mark.parametrize("workload, arrival", [
    ({"num_requests": 6, "arrival": {"process": "closed", "concurrency": 4}, "trace": LENGTHS},
     {"process": "closed", "concurrency": 4, "think_time_s": 0.0, "think": "constant"}),
    ({"num_requests": 6, "arrival": {"process": "closed", "concurrency": 2}, "trace": LENGTHS},
     {"process": "closed", "concurrency": 2, "think_time_s": 0.0, "think": "constant"}),
    ({"num_requests": 6, "arrival": {"process": "poisson", "rate": 3.0}, "trace": LENGTHS},
     {"process": "poisson", "rate": 3.0}),
    ({"arrival": {"process": "constant", "rate": 2.0}, "trace": BENCH}, {"process": "constant", "rate": 2.0}),
])
def test_a_trace_without_times_reports_the_arrival_process(workload, arrival):
    prov = _provenance(workload)
    assert prov["arrival"] == arrival
    assert prov["trace"]["path"] == workload["trace"]["path"]
    assert prov["trace"]["format"] == workload["trace"]["format"]


def test_a_trace_with_times_is_the_arrival():
    prov = _provenance({"trace": {"format": "azure", "path": "azure_code_small.csv"}})
    assert prov["arrival"]["format"] == "azure" and prov["arrival"]["path"] == "azure_code_small.csv"
    assert prov["trace"] == prov["arrival"]


def test_no_trace_no_trace_key():
    prov = _provenance({"num_requests": 3, "arrival": {"process": "poisson", "rate": 2.0}})
    assert prov["arrival"] == {"process": "poisson", "rate": 2.0} and "trace" not in prov
