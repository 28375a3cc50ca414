"""The workload section's validation: unknown keys, bounds, choices, cross-field rules."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from batchsim.workloads import WorkloadConfig
from batchsim.workloads.config import GammaArrival, LognormalLength, PoissonArrival, FixedLength

EXAMPLE = """
num_requests: 2000
duration_s: null
arrival: {process: poisson, rate: 5.0}
prompt_tokens: {dist: lognormal, median: 512, p90: 2048, max: 8192}
output_tokens: {dist: fixed, value: 128}
trace: null
"""


def invalid(data: dict) -> str:
    with pytest.raises(ValidationError) as e:
        WorkloadConfig.model_validate(data)
    return str(e.value)


def test_the_documented_example_loads():
    cfg = WorkloadConfig.model_validate(yaml.safe_load(EXAMPLE))
    assert cfg.num_requests == 2000
    assert cfg.arrival == PoissonArrival(process="poisson", rate=5.0)
    assert cfg.prompt_tokens == LognormalLength(dist="lognormal", median=512, p90=2048, max=8192)
    assert cfg.output_tokens == FixedLength(dist="fixed", value=128)


def test_defaults_are_the_documented_ones():
    cfg = WorkloadConfig(num_requests=10)
    assert cfg.arrival.rate == 5.0 and cfg.prompt_tokens.p90 == 2048 and cfg.output_tokens.value == 128


def test_every_field_has_a_description():
    from batchsim.workloads import config

    models = [getattr(config, n) for n in config.__all__ if isinstance(getattr(config, n), type)]
    for m in models:
        for name, f in m.model_fields.items():
            assert f.description, f"{m.__name__}.{name} has no description"


@pytest.mark.parametrize("data, fragment", [
    ({}, "set num_requests or duration_s (or both) for a synthetic workload"),
    ({"num_requests": 5, "arival": {}}, "arival\n  Extra inputs are not permitted"),
    ({"num_requests": -1}, "num_requests\n  Input should be greater than or equal to 0"),
    ({"num_requests": 5, "arrival": {"process": "poison", "rate": 1}}, "does not match any of the expected tags"),
    ({"num_requests": 5, "arrival": {"process": "poisson", "rate": -1}}, "arrival.poisson.rate\n  Input should be greater than or equal to 0"),
    ({"num_requests": 5, "arrival": {"process": "gamma", "rate": 1, "cv": 0}}, "arrival.gamma.cv\n  Input should be greater than 0"),
    ({"num_requests": 5, "arrival": {"process": "diurnal", "rate": 1, "amplitude": 1.5}}, "less than or equal to 1"),
    ({"num_requests": 5, "prompt_tokens": {"dist": "uniform", "min": 10, "max": 5}}, "max (5) must be >= min (10)"),
    ({"num_requests": 5, "prompt_tokens": {"dist": "lognormal", "median": 500, "p90": 100}}, "p90 (100.0) must be >= median (500.0)"),
    ({"num_requests": 5, "prompt_tokens": {"dist": "lognormal", "median": 5, "p90": 10, "min": 8, "max": 4}}, "max (4) must be >= min (8)"),
    ({"num_requests": 5, "output_tokens": {"dist": "fixed", "value": 0}}, "value\n  Input should be greater than or equal to 1"),
    ({"trace": {"format": "azure", "path": "a.csv", "end_s": 5, "start_s": 10}}, "end_s (5.0) must be greater than start_s (10.0)"),
    ({"trace": {"format": "azure", "path": "a.csv", "speedup": 0}}, "speedup\n  Input should be greater than 0"),
    ({"trace": {"format": "azure", "path": "a.csv", "sample": 1.5}}, "sample\n  Input should be less than or equal to 1"),
    ({"trace": {"format": "azure", "path": "a.csv", "model": "x"}}, "model\n  Extra inputs are not permitted"),
    ({"trace": {"format": "lengths", "path": "a.csv", "start_s": 3}}, "start_s\n  Extra inputs are not permitted"),
    ({"trace": {"format": "parquet", "path": "a"}}, "does not match any of the expected tags"),
    ({"trace": {"format": "csv", "path": "a.csv", "time_unit": "h"}}, "time_unit\n  Input should be 's', 'ms', 'us', 'ns' or 'datetime'"),
    ({"trace": {"format": "azure", "path": "a.csv"}, "arrival": {"process": "poisson", "rate": 1}},
     "arrival cannot be combined with trace (format 'azure'), which supplies them; remove them or use format 'lengths'"),
    ({"trace": {"format": "lengths", "path": "a.csv"}, "prompt_tokens": {"dist": "fixed", "value": 3}},
     "prompt_tokens cannot be combined with trace (format 'lengths')"),
    # `--set workload.arrival.rate=20` next to a trace with times: an arrival without a process, which
    # failed as "missing 'process'" and hid the mistake
    ({"trace": {"format": "azure", "path": "a.csv"}, "arrival": {"rate": 20}},
     "arrival cannot be combined with trace (format 'azure'), which supplies them"),
    ({"trace": {"format": "vllm_bench", "path": "r.json"}, "arrival": {"process": "poisson", "rate": -1}},
     "arrival cannot be combined with trace (format 'vllm_bench'), which supplies them"),
    ({"trace": {"format": "lengths", "path": "a.csv"}, "output_tokens": {"value": 3}},
     "output_tokens cannot be combined with trace (format 'lengths')"),
    ({"trace": {"format": "vllm_bench", "path": "r.json", "arrivals_from": "arrival", "speedup": 2}},
     "speedup apply to recorded arrivals; with arrivals_from: arrival set the rate in workload.arrival instead"),
    ({"num_requests": 5, "arrival": {"process": "empirical", "trace": {"format": "lengths", "path": "a.csv"}}},
     "trace.format 'lengths' has no arrival times; expected one of azure, mooncake, burstgpt, csv, jsonl"),
])
def test_invalid_configs_name_the_field(data, fragment):
    assert fragment in invalid(data)


def test_a_trace_alone_or_with_its_arrival_section_is_valid():
    assert WorkloadConfig.model_validate({"trace": {"format": "mooncake", "path": "m.jsonl"}}).trace_has_arrivals
    cfg = WorkloadConfig.model_validate({"trace": {"format": "lengths", "path": "l.csv"}, "arrival": {"process": "gamma", "rate": 2, "cv": 2}})
    assert not cfg.trace_has_arrivals and cfg.arrival == GammaArrival(process="gamma", rate=2, cv=2)
    cfg = WorkloadConfig.model_validate({"trace": {"format": "vllm_bench", "path": "r.json", "arrivals_from": "arrival"},
                                         "arrival": {"process": "constant", "rate": 1}})
    assert not cfg.trace_has_arrivals


def test_zero_rates_and_zero_counts_are_valid():
    for arrival in ({"process": "poisson", "rate": 0}, {"process": "onoff", "rate_on": 0, "mean_on_s": 1, "mean_off_s": 1},
                    {"process": "diurnal", "rate": 0}, {"process": "constant", "rate": 0}):
        WorkloadConfig.model_validate({"num_requests": 0, "arrival": arrival})


def test_configs_are_frozen_values():
    cfg = WorkloadConfig(num_requests=3)
    with pytest.raises(ValidationError):
        cfg.num_requests = 4  # type: ignore[misc]
