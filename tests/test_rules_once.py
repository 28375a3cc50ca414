"""One statement of the rules: an edited rule changes the default engine exactly as the SimPy one.

The built-in policies are recipes (batchsim/policies/recipe.py) interpreted by
batchsim/policies/step.py and batchsim/policies/padded.py in Python and by batchsim/core/_core.c in C.
These tests change a rule the ways a user would — a recipe, a monkeypatched
``schedule``, a monkeypatched interpreter method, an in-place edit of the
interpreter in a copy of the source — and check that the default engine
(``auto``) gives exactly the SimPy engine's output for the changed rule, says
which engine ran and why, and that ``batchsim regress`` on the shipped
baselines fails for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import batchsim.policies.continuous as continuous_mod
from batchsim.policies.continuous import ContinuousPolicy
from batchsim.policies.recipe import IterationRecipe, Move, PaddedRecipe
from batchsim.policies.rules import interpret
from batchsim.policies.step import StepBuilder
from batchsim import core
from batchsim.core import rules
from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import run_scenario

ROOT = Path(__file__).resolve().parents[1]

needs_core = pytest.mark.skipif(core.library() is None, reason="no C compiler: the compiled core is unavailable")

# A decode-first rule: the running decodes go first and prompts enter only on a step with no decodes.
DECODE_FIRST = (Move("decodes"), Move("admit", unless=("rows",)))


def _scenario(policy: dict | None = None, engine: str = "auto", n: int = 300, rate: float = 12.0) -> dict:
    return {
        "name": "rules-once", "model": "llama-3-8b", "hardware": "h100-sxm",
        "policy": policy or {"name": "continuous"}, "engine": engine, "seed": 3,
        "workload": {"num_requests": n, "arrival": {"process": "poisson", "rate": rate},
                     "prompt_tokens": {"dist": "lognormal", "median": 500, "p90": 2000, "max": 6000},
                     "output_tokens": {"dist": "lognormal", "median": 120, "p90": 400, "max": 800}},
    }


def _run(sc: dict):
    return run_scenario(scenario_from_dict(sc))


def _digest(result) -> str:
    """The run's records and metrics (not which engine ran)."""
    from tests.engine_helpers import outcome

    summary = outcome(result.summary)
    h = hashlib.sha256(json.dumps(summary, sort_keys=True).encode())
    h.update(result.requests.to_csv(index=False).encode())
    h.update(result.steps.to_csv(index=False).encode())
    return h.hexdigest()


@needs_core
def test_shipped_rules_are_the_ones_the_core_implements():
    diff = core.rules_differ()
    assert not diff, (f"{len(diff)} rule(s) differ from the compiled core's table ({diff[:5]}): change the "
                      "core's interpreter to match, then run `python -m batchsim.core.rules --update`")


@needs_core
@pytest.mark.parametrize("policy", [{"name": "continuous"}, {"name": "continuous", "prefill_mode": "mixed"},
                                    {"name": "chunked_prefill"}, {"name": "static"},
                                    {"name": "dynamic", "preferred_batch_sizes": [2, 4]}])
def test_builtin_policies_run_on_the_core_and_say_so(policy):
    auto = _run(_scenario(policy, n=120))
    assert auto.summary["engine"] == "core" and auto.summary["engine_reason"] is None
    ref = _run(_scenario(policy, engine="python", n=120))
    assert ref.summary["engine"] == "python" and ref.summary["engine_reason"] == "engine: python was asked for"
    assert _digest(auto) == _digest(ref)


@needs_core
def test_an_edited_recipe_runs_on_the_core_with_the_edit(monkeypatch):
    before = _run(_scenario())
    monkeypatch.setitem(continuous_mod.MOVES, "separate", DECODE_FIRST)
    auto, ref = _run(_scenario()), _run(_scenario(engine="python"))
    assert auto.summary["engine"] == "core"
    assert _digest(auto) == _digest(ref)
    assert _digest(auto) != _digest(before)
    assert auto.summary["p99_ttft_ms"] > 2 * before.summary["p99_ttft_ms"]


def test_a_monkeypatched_schedule_runs_on_the_simpy_engine(monkeypatch):
    before = _run(_scenario())

    def decode_first(self, view):
        return interpret(replace(self.recipe, moves=DECODE_FIRST), view)

    monkeypatch.setattr(ContinuousPolicy, "schedule", decode_first)
    auto, ref = _run(_scenario()), _run(_scenario(engine="python"))
    assert auto.summary["engine"] == "python"
    assert "overrides schedule" in auto.summary["engine_reason"]
    assert _digest(auto) == _digest(ref) != _digest(before)
    with pytest.raises(Exception, match="overrides schedule"):
        _run(_scenario(engine="core"))


@needs_core
def test_a_monkeypatched_interpreter_method_runs_on_the_simpy_engine(monkeypatch):
    before = _run(_scenario())
    original = StepBuilder.admit

    def admit_one_per_step(self, candidates, chunked):  # at most one admission a step
        self.slots = min(self.slots, 1)
        return original(self, candidates, chunked)

    monkeypatch.setattr(StepBuilder, "admit", admit_one_per_step)
    auto, ref = _run(_scenario()), _run(_scenario(engine="python"))
    assert auto.summary["engine"] == "python"
    assert "batchsim.policies.step.StepBuilder.admit" in auto.summary["engine_reason"]
    assert _digest(auto) == _digest(ref) != _digest(before)


@needs_core
def test_a_changed_constant_or_strategy_entry_runs_on_the_simpy_engine(monkeypatch):
    import batchsim.calibrate.work
    import batchsim.policies.ordering

    before = _run(_scenario())
    monkeypatch.setattr(batchsim.calibrate.work, "B_ACT", 4.0)  # activations in fp32: a cost formula's constant
    auto = _run(_scenario())
    assert auto.summary["engine"] == "python" and "batchsim.calibrate.work.B_ACT" in auto.summary["engine_reason"]
    assert _digest(auto) == _digest(_run(_scenario(engine="python"))) != _digest(before)
    monkeypatch.undo()

    busy = _run(_scenario(rate=60.0))
    monkeypatch.setitem(batchsim.policies.ordering.QUEUE_ORDERS, "fcfs", lambda waiting: list(reversed(waiting)))
    auto = _run(_scenario(rate=60.0))
    assert auto.summary["engine"] == "python"
    assert "batchsim.policies.ordering.QUEUE_ORDERS[fcfs]" in auto.summary["engine_reason"]
    assert _digest(auto) == _digest(_run(_scenario(engine="python", rate=60.0))) != _digest(busy)


@needs_core
@pytest.mark.parametrize("patch", ["wraps", "imported_name", "runner_wiring", "alias", "method_lambda",
                                   "exec_method", "partialmethod"])
def test_subtler_monkeypatches_run_on_the_simpy_engine(monkeypatch, patch):
    """Found by review: a functools.wraps wrapper, a rebound imported name, the runner's wiring, an alias."""
    import functools

    import batchsim.calibrate.costmodel
    import batchsim.policies.step
    import batchsim.sim.kv
    import batchsim.sim.router
    import batchsim.app.runner

    if patch == "wraps":
        original = StepBuilder.admit

        @functools.wraps(original)
        def one_admission(self, candidates, chunked):
            self.slots = min(self.slots, 1)
            return original(self, candidates, chunked)

        monkeypatch.setattr(StepBuilder, "admit", one_admission)
    elif patch == "imported_name":
        monkeypatch.setattr(batchsim.policies.step, "held_blocks", lambda kv, seq, reserve=0: 0)
    elif patch == "runner_wiring":
        real = batchsim.sim.router.make_router
        monkeypatch.setattr(batchsim.app.runner, "make_router", lambda name, rng: real("round_robin", rng))
    else:
        monkeypatch.setattr(batchsim.calibrate.costmodel, "_sum", lambda a: 2 * a.sum())
    sc = _scenario(dict(name="continuous", gpu_memory_utilization=0.3), rate=40.0)
    if patch == "runner_wiring":
        sc.update(replicas=2, router="least_kv")
    auto = _run(sc)
    assert auto.summary["engine"] == "python", patch
    assert _digest(auto) == _digest(_run(dict(sc, engine="python")))


def test_recipes_that_would_take_a_sequence_twice_are_refused():
    for moves in [(Move("decodes"), Move("admit"), Move("admit_chunks")), (Move("admit"), Move("admit")),
                  (Move("decodes"), Move("decodes"), Move("admit"))]:
        with pytest.raises(ValueError, match="each move at most once"):
            IterationRecipe(moves=moves, max_num_seqs=4, max_num_batched_tokens=64)


def test_one_recipe_for_every_replica_and_read_once(monkeypatch):
    calls = []
    orig = ContinuousPolicy.make_recipe

    def alternating(self):  # a different recipe on every other replica
        calls.append(1)
        r = orig(self)
        return replace(r, moves=DECODE_FIRST) if len(calls) % 2 == 0 else r

    monkeypatch.setattr(ContinuousPolicy, "make_recipe", alternating)
    res = _run(dict(_scenario(), replicas=2, router="round_robin"))
    assert res.summary["engine"] == "python" and "recipes differ" in res.summary["engine_reason"]
    monkeypatch.undo()

    res = _run(_scenario({"name": f"{__name__}:DriftingPolicy"}, n=40))
    assert res.summary["engine"] == "python" and "computes its recipe" in res.summary["engine_reason"]


class DriftingPolicy(ContinuousPolicy):
    """A recipe computed at every step (a property): the core, which reads it once, must not run it."""

    @property
    def recipe(self):
        return self.make_recipe()

    @recipe.setter
    def recipe(self, value):
        pass


def test_an_outside_policy_runs_on_the_simpy_engine_and_says_why():
    sys.path.insert(0, str(ROOT / "examples" / "ci" / "plugin"))
    try:
        res = _run(_scenario({"name": "spf_policy.policy:ShortestPromptFirst"}, n=60))
    finally:
        sys.path.remove(str(ROOT / "examples" / "ci" / "plugin"))
    assert res.summary["engine"] == "python"
    assert "not a recipe policy" in res.summary["engine_reason"]


def test_recipes_are_validated_values():
    with pytest.raises(ValueError, match="unknown move 'decode'"):
        Move("decode")
    with pytest.raises(ValueError, match="unknown guard"):
        Move("decodes", unless=("never",))
    with pytest.raises(ValueError, match="max_num_seqs"):
        IterationRecipe(moves=DECODE_FIRST, max_num_seqs=0, max_num_batched_tokens=8)
    with pytest.raises(ValueError, match="max_queue_delay_s"):
        PaddedRecipe(max_batch_size=4, max_queue_delay_s=-1.0)


def test_the_fingerprint_ignores_docstrings_and_comments_but_not_code():
    def a(x):
        """Doc."""
        # a comment
        return x + 1

    def b(x):

        return x + 1  # inline comments are code lines

    def c(x):
        return x + 2

    def body(fn) -> str:
        return rules._normalised(fn).split("\n", 1)[1]

    assert body(a) == body(b).replace("  # inline comments are code lines", "") != body(c)


# -- an in-place edit of the shipped source, in a copy of the tree -------------------------------

_EDITS = {
    # the interpreter: admit at most one prompt per step
    "interpreter": ("batchsim/policies/step.py", "            if self.slots < 1 or self.budget < 1:\n                return\n",
                    "            if self.slots < 1 or self.budget < 1 or self.num_tokens:\n                return\n"),
    # a built-in recipe: decode-first continuous batching
    "recipe": ("batchsim/policies/continuous.py", '"separate": (Move("admit"), Move("decodes", unless=("rows",))),',
               '"separate": (Move("decodes"), Move("admit", unless=("rows",))),'),
}

_PROBE = """
import hashlib, json, sys
from batchsim.app.config import scenario_from_dict
from batchsim.app.runner import run_scenario
sc = json.loads(sys.argv[1])
out = {}
for engine in ("auto", "python"):
    r = run_scenario(scenario_from_dict(dict(sc, engine=engine)))
    s = {k: v for k, v in r.summary.items() if k not in ("engine", "engine_reason", "provenance")}
    h = hashlib.sha256(json.dumps(s, sort_keys=True).encode())
    h.update(r.requests.to_csv(index=False).encode())
    h.update(r.steps.to_csv(index=False).encode())
    out[engine] = [h.hexdigest(), r.summary["engine"], r.summary["engine_reason"]]
print(json.dumps(out))
"""


def _copy_tree(dest: Path, edit: str | None) -> Path:
    ignore = shutil.ignore_patterns(".git", ".venv", "runs", "__pycache__", "*.egg-info", ".pytest_cache",
                                    ".hypothesis", "docs", "bench")
    shutil.copytree(ROOT, dest, ignore=ignore)
    if edit is not None:
        rel, old, new = _EDITS[edit]
        path = dest / rel
        text = path.read_text()
        assert text.count(old) == 1, f"the edit no longer applies to {rel}"
        path.write_text(text.replace(old, new))
    return dest


def _probe(tree: Path, sc: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(sc)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_core
@pytest.mark.slow
@pytest.mark.parametrize("edit", ["interpreter", "recipe"])
def test_an_in_place_edit_changes_the_default_engine_as_the_simpy_one(tmp_path, edit):
    sc = _scenario()
    original = _probe(_copy_tree(tmp_path / "orig", None), sc)
    edited = _probe(_copy_tree(tmp_path / "edit", edit), sc)
    assert original["auto"][1] == "core" and original["auto"][0] == original["python"][0]
    assert edited["auto"][0] == edited["python"][0] != original["auto"][0]
    if edit == "interpreter":  # the core cannot show it runs the edited interpreter
        assert edited["auto"][1] == "python"
        assert "batchsim.policies.step.StepBuilder.admit" in edited["auto"][2]
    else:  # the core interprets the edited recipe
        assert edited["auto"][1] == "core"


@needs_core
@pytest.mark.slow
@pytest.mark.parametrize("edit", ["interpreter", "recipe"])
def test_regress_on_the_shipped_baselines_fails_for_an_in_place_edit(tmp_path, edit):
    tree = _copy_tree(tmp_path / "tree", edit)
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, "-m", "batchsim.app.cli", "regress", "baselines/continuous.yaml",
                           "--baseline", "baselines/baseline.json"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "REGRESSION" in proc.stdout.upper() or "regress" in proc.stdout.lower()
