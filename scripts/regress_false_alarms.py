"""How often `batchsim regress` fails a neutral change, and whether it catches real ones.

Prints, for the shipped baselines (baselines/*.yaml against baselines/baseline.json,
the gate `make test` runs), at the gate's defaults:

- **false alarms**: a neutral change modelled as every seed shifted by k (the workloads are
  reshuffled, the code is the same, so nothing really changed): how many of the offsets
  k = 50, 100, ... fail the whole invocation, and on which scenario x metric;
- **detection** of real changes: (a) a cost model 10% slower (every bandwidth and peak
  FLOP/s / 1.1, as tests/test_regress_cli.py does), (b) vLLM's preemption victim rule edited
  in place to take the *first* admitted sequence (batchsim/policies/ordering.py, which also
  makes every run fall back to the SimPy engine), (c) the continuous recipe edited in place
  to decode first (batchsim/policies/continuous.py), (d) the step builder's admission edited to
  admit at most one prompt per step (batchsim/policies/step.py); (c) and (d) are the in-place
  edits of tests/test_rules_once.py.

Each real change runs in a copy of the tree (the edits never touch this checkout).

    PYTHONPATH=. python scripts/regress_false_alarms.py [--offsets 50:1000:50]

About 2 s of simulation per offset and per change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_EDITS = {
    "victim": ("batchsim/policies/ordering.py",
               '    """vLLM\'s preemption victim: the most recently admitted (last in admission order)."""\n'
               "    return running[-1]\n",
               '    """vLLM\'s preemption victim: the most recently admitted (last in admission order)."""\n'
               "    return running[0]\n"),
    "one_prompt": ("batchsim/policies/step.py",
                   "            if self.slots < 1 or self.budget < 1:\n                return\n",
                   "            if self.slots < 1 or self.budget < 1 or self.num_tokens:\n                return\n"),
    "decode_first": ("batchsim/policies/continuous.py",
                     '"separate": (Move("admit"), Move("decodes", unless=("rows",))),',
                     '"separate": (Move("decodes"), Move("admit", unless=("rows",))),'),
}

_GATE = """
import glob, json, sys
from batchsim.app.regress import regress
from batchsim.reports.regression import FAILING
rep = regress(sorted(glob.glob("baselines/*.yaml")), "baselines/baseline.json")
print(json.dumps({"exit": rep.exit_code,
                  "failing": [[s.key, d.metric, d.status] for s, d in rep.rows(*FAILING)],
                  "notes": [n for s in rep.scenarios for n in s.notes]}))
"""


def _gate(runner=None) -> tuple[int, list]:
    import glob

    from batchsim.app.regress import regress
    from batchsim.reports.regression import FAILING

    rep = regress(sorted(glob.glob(str(ROOT / "baselines" / "*.yaml"))), ROOT / "baselines" / "baseline.json",
                  runner=runner)
    return rep.exit_code, [(s.key, d.metric, d.status) for s, d in rep.rows(*FAILING)]


def neutral(offsets: list[int]) -> None:
    from batchsim.app.compare import with_seed
    from batchsim.app.regress import _default_runner

    failed = 0
    for k in offsets:
        code, bad = _gate(lambda sc, bd, k=k: _default_runner(with_seed(sc, k), bd))
        failed += code != 0
        print(f"  offset {k:5d}: exit {code}" + (f"  {bad}" if bad else ""))
    print(f"false alarms: {failed} of {len(offsets)} neutral offsets fail the gate")


def slower() -> None:
    import batchsim.app.runner as runner_mod

    real = runner_mod.load_hardware

    def slow(name):
        hw = real(name)
        return hw.model_copy(update={"hbm_bandwidth_gbs": hw.hbm_bandwidth_gbs / 1.1,
                                     "peak_tflops": {k: v / 1.1 for k, v in hw.peak_tflops.items()}})

    runner_mod.load_hardware = slow
    try:
        code, bad = _gate()
    finally:
        runner_mod.load_hardware = real
    _detection("(a) cost model 10% slower", code, bad)


def edited(label: str, edit: str) -> None:
    rel, old, new = _EDITS[edit]
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(ROOT, tree, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "runs", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis", "docs", "bench"))
        path = tree / rel
        text = path.read_text()
        if text.count(old) != 1:
            sys.exit(f"the edit {edit!r} no longer applies to {rel}")
        path.write_text(text.replace(old, new))
        proc = subprocess.run([sys.executable, "-c", _GATE], cwd=tree, capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=str(tree)), timeout=600)
        if proc.returncode != 0:
            sys.exit(proc.stderr[-3000:])
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    _detection(label, out["exit"], out["failing"])
    engine = sorted({n for n in out["notes"] if "engine" in n.lower()})
    print(f"    engine notes: {engine[:1] or 'none'}{' ...' if len(engine) > 1 else ''}")


def _detection(label: str, code: int, bad: list) -> None:
    per = {}
    for key, metric, _ in bad:
        per.setdefault(key, []).append(metric)
    print(f"{label}: exit {code}, {'DETECTED' if code == 1 else 'missed'}: {len(bad)} failing check(s)")
    for key, metrics in per.items():
        print(f"    {key}: {', '.join(metrics)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--offsets", default="50:500:50", help="first:last:step seed offsets of the neutral change")
    ap.add_argument("--skip-edits", action="store_true", help="only the neutral offsets and the slower cost model")
    ap.add_argument("--only-edits", action="store_true", help="only the in-place rule edits")
    a = ap.parse_args()
    if not a.only_edits:
        first, last, step = map(int, a.offsets.split(":"))
        neutral(list(range(first, last + 1, step)))
        slower()
    if not a.skip_edits:
        edited("(b) preemption victim: first admitted (ordering.py)", "victim")
        edited("(c) continuous recipe: decodes first (continuous.py)", "decode_first")
        edited("(d) admission: at most one prompt per step (step.py)", "one_prompt")


if __name__ == "__main__":
    main()
