"""Plan points long enough for a steady state (docs/capacity-planning.md, "points run long enough"):
what is lengthened, what is not, and the bounds on it (review 25)."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest

from batchsim.app.capacity.planner import PlanSpec, plan, problem_lines, write_plan
from batchsim.app.capacity.worker import longer
from batchsim.app.config import scenario_from_dict
from batchsim.sim.errors import InputError

RAW = {"name": "long", "model": "llama-3-8b", "hardware": "h100-sxm", "engine_preset": "vllm-v1", "seed": 1,
       "workload": {"num_requests": 100, "arrival": {"process": "poisson", "rate": 8},
                    "prompt_tokens": {"dist": "lognormal", "median": 400, "p90": 1200, "max": 3000},
                    "output_tokens": {"dist": "fixed", "value": 64}}}
SLO = {"p99_ttft_ms": 2000.0}


def _plan(tmp_path, name, raw=RAW, **spec):
    res = plan(scenario_from_dict(raw), PlanSpec(slos=SLO, policies=("chunked_prefill",), seeds=1, **spec),
               tmp_path / name, executor="serial")
    return res, res.frame.iloc[0]


def test_a_duration_workload_is_not_lengthened(tmp_path):
    """duration_s caps the arrivals: asking for more requests would change nothing but the report."""
    raw = copy.deepcopy(RAW)
    raw["workload"].update(num_requests=2000, duration_s=12.0)  # (the duration binds: it stops first)
    _, row = _plan(tmp_path, "d", raw)
    assert row["lengthened_rates"] == 0 and pd.isna(row["longest_point"])
    # (the requests its capacity point ran, not the count at the scenario's own rate)
    assert row["point_requests"] == pytest.approx(12.0 * row["capacity_rps"], rel=0.3)


def test_an_overloaded_rate_is_lengthened_a_bounded_number_of_times(tmp_path):
    """An overloaded queue's E2E grows with the run, so its share of a steady state never reaches 1:
    with a cap of millions the plan stops after at most 4 longer runs of at most 4 times the one before
    (it ran to the cap before: 3.6 million requests after two minutes, still growing)."""
    from batchsim.app.capacity.worker import LONGER_ROUNDS, LONGER_STEP

    _, row = _plan(tmp_path, "o", max_requests=5_000_000)
    assert row["status"] == "ok" and row["longest_point"] <= 100 * LONGER_STEP ** LONGER_ROUNDS, row["longest_point"]


def test_an_empty_window_is_lengthened_until_it_measures(tmp_path):
    """A warm-up longer than the point's run measures nothing; the run doubles until it does."""
    raw = copy.deepcopy(RAW)
    raw["measure"] = {"warmup_s": 30}
    _, row = _plan(tmp_path, "w", raw, max_requests=20_000)
    assert row["status"] == "ok" and row["capacity_rps"] > 0 and row["lengthened_rates"] >= 1
    assert longer({"measured_requests": 0}, 100, 1000) == 200 and longer({"measured_requests": 0}, 600, 1000) == 1000
    assert longer({"measured_requests": 0}, 1000, 1000) is None


def test_max_requests_is_checked_and_recorded(tmp_path):
    for bad in (0, -5, 10**9):
        with pytest.raises(InputError, match="--max-requests"):
            _plan(tmp_path, "bad", max_requests=bad)
    with pytest.raises(InputError, match=r"at least workload.num_requests \(100\)"):
        _plan(tmp_path, "low", max_requests=99)
    res, _ = _plan(tmp_path, "ok", max_requests=400)
    write_plan(res, tmp_path / "ok")
    assert json.loads((tmp_path / "ok" / "plan.json").read_text())["max_requests"] == 400


def test_short_says_the_cap_only_when_the_point_reached_it():
    import pandas as pd

    row = {"config": "c", "status": "ok", "steady_share": 0.8, "arrival_span_e2els": 9.0, "point_requests": 4685.0,
           "max_requests": 5000, "lengthened_rates": 3}
    (line,) = problem_lines(pd.DataFrame([row]))
    assert line.startswith("SHORT c: ") and "the most --max-requests allows" not in line
    (line,) = problem_lines(pd.DataFrame([{**row, "point_requests": 5000.0}]))
    assert "with 5000 requests (the most --max-requests allows)" in line
    assert not problem_lines(pd.DataFrame([{**row, "steady_share": 1.0}]))
