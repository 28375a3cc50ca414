"""The policy registry: names, plugins, and the errors a user sees."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

from batchsim import policies
from batchsim.policies import registry
from batchsim.policies.chunked_prefill import ChunkedPrefillPolicy
from batchsim.policies.continuous import ContinuousPolicy
from batchsim.policies.dynamic import DynamicPolicy
from batchsim.policies.static import StaticPolicy
from batchsim.sim.errors import InputError
from batchsim.sim.protocols import Policy
from tests.policy_fakes import FakeKV, FakeSeq, OneAtATime, simulate

BUILTINS = {"static": StaticPolicy, "dynamic": DynamicPolicy, "continuous": ContinuousPolicy,
            "chunked_prefill": ChunkedPrefillPolicy}


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtins_are_registered_and_satisfy_the_protocol(name):
    policy = policies.create_policy({"name": name})
    assert type(policy) is BUILTINS[name] and policy.name == name
    assert isinstance(policy, Policy)
    assert policy.config.block_size == 16 and policy.config.gpu_memory_utilization == 0.9
    assert policy.config.max_model_len is None


def test_policy_names_lists_the_builtins():
    assert set(BUILTINS) <= set(policies.policy_names())


def test_knobs_reach_the_config():
    p = policies.create_policy({"name": "continuous", "max_num_seqs": 4, "prefill_mode": "mixed",
                                "block_size": 32})
    assert (p.config.max_num_seqs, p.config.prefill_mode, p.config.block_size) == (4, "mixed", 32)


def test_unknown_name_lists_valid_names():
    with pytest.raises(InputError) as e:
        policies.create_policy({"name": "contiuous"})
    assert e.value.where == "policy.name"
    assert "'contiuous'" in str(e.value)
    for name in BUILTINS:
        assert name in str(e.value)


def test_missing_name():
    with pytest.raises(InputError, match="policy.name"):
        policies.create_policy({"max_num_seqs": 4})


@pytest.mark.parametrize("spec, where, words", [
    ({"name": "continuous", "max_num_seqs": 0}, "policy.max_num_seqs", ["got 0", "greater than or equal to 1"]),
    ({"name": "continuous", "prefill_mode": "both"}, "policy.prefill_mode", ["'both'", "'separate' or 'mixed'"]),
    ({"name": "chunked_prefill", "order": "lifo"}, "policy.order", ["'lifo'", "'fcfs'"]),
    ({"name": "static", "complete_at": "never"}, "policy.complete_at", ["'never'", "'batch_end'"]),
    ({"name": "static", "timeout_s": -1}, "policy.timeout_s", ["got -1"]),
    ({"name": "static", "gpu_memory_utilization": 1.5}, "policy.gpu_memory_utilization", ["got 1.5"]),
    ({"name": "static", "max_num_seqs": 8}, "policy.max_num_seqs", ["unknown knob", "max_batch_size"]),
    ({"name": "dynamic", "preferred_batch_sizes": [2, 16]}, "policy.preferred_batch_sizes",
     ["[16]", "max_batch_size (8)"]),
    ({"name": "continuous", "max_num_seqs": 64, "max_num_batched_tokens": 32}, "policy.max_num_batched_tokens",
     ["(32)", "(64)"]),
])
def test_bad_knob_names_field_value_and_expectation(spec, where, words):
    with pytest.raises(InputError) as e:
        policies.create_policy(spec)
    assert e.value.where == where
    for w in words:
        assert w in str(e.value)


def test_module_colon_class_loads_an_outside_policy():
    policy = policies.create_policy({"name": "tests.policy_fakes:OneAtATime"})
    assert isinstance(policy, OneAtATime)
    run = simulate(policy, [FakeSeq(0, 3, 2), FakeSeq(1, 2, 1)], FakeKV(4, 10))
    assert sorted(run.finished) == [0, 1] and not run.stuck


@pytest.mark.parametrize("name, match", [
    ("no_such_module_xyz:Policy", "cannot load"),
    ("tests.policy_fakes:Missing", "cannot load"),
    ("tests.policy_fakes:FakeSeq", "not a batchsim policy"),
])
def test_module_colon_class_errors(name, match):
    with pytest.raises(InputError, match=match) as e:
        policies.create_policy({"name": name})
    assert e.value.where == "policy.name"


def test_entry_point_plugin(monkeypatch):
    ep = EntryPoint(name="one", value="tests.policy_fakes:OneAtATime", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep] if group == ep.group else [])
    assert "one" in policies.policy_names()
    assert isinstance(policies.create_policy({"name": "one"}), OneAtATime)


def test_register_refuses_a_second_class_under_a_taken_name():
    with pytest.raises(ValueError, match="already registered"):
        registry.register("static")(type("Other", (), {}))


def test_configs_are_frozen():
    policy = policies.create_policy({"name": "static"})
    with pytest.raises(Exception):
        policy.config.max_batch_size = 3


def test_policies_import_neither_simpy_nor_torch_nor_calibrate():
    code = "import sys, batchsim.policies; print(sorted(m for m in ('simpy', 'torch', 'batchsim.calibrate') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
