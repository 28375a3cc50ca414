"""A run's outputs are written as one set: never a mix of an old run's files and a new one's.

batchsim.sim.io.write_set writes into a temporary folder beside the output
folder, the manifest last, then swaps the folders (or, in a folder holding
other files, renames the new files in, removes the previous set's others and
writes the manifest last); a killed writer's leftovers go at the next write.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from batchsim.app.cli import app
from batchsim.sim.io import MANIFEST, clean_orphans, write_set

ROOT = Path(__file__).resolve().parents[1]


def _run(out: Path, *sets: str) -> None:
    res = CliRunner().invoke(app, ["run", str(ROOT / "examples" / "continuous.yaml"), "--out", str(out),
                                   "--set", "workload.num_requests=40", *[a for s in sets for a in ("--set", s)]])
    assert res.exit_code == 0, res.output


def test_a_rerun_replaces_the_whole_set(tmp_path):
    out = tmp_path / "run"
    _run(out)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "requests.csv", "steps.csv", "summary.json"]
    _run(out, "measure.step_records=false", "seed=5")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "requests.csv", "summary.json"]  # no old steps.csv
    manifest = json.loads((out / MANIFEST).read_text())
    assert set(manifest["files"]) == {"summary.json", "requests.csv"}
    assert manifest["files"]["requests.csv"] == (out / "requests.csv").stat().st_size
    assert json.loads((out / "summary.json").read_text())["provenance"]["seed"] == 5
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.")]  # nothing left beside it


def test_a_folder_with_other_files_keeps_them(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "steps.csv").write_text("an old run's steps\n")  # a set written before manifests existed
    _run(out, "measure.step_records=false")
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "steps.csv").exists()
    assert set(json.loads((out / MANIFEST).read_text())["files"]) == {"summary.json", "requests.csv"}


_KILLED = """
import sys, time
from pathlib import Path
from batchsim.sim.io import write_set
def slow(p):
    p.write_text("new " * 1000)
    time.sleep(60)
write_set(sys.argv[1], {"summary.json": lambda p: p.write_text("new"), "requests.csv": slow})
"""


def test_kill_9_mid_write_leaves_the_old_set_whole_and_the_next_write_cleans_up(tmp_path):
    out = tmp_path / "run"
    write_set(out, {"summary.json": lambda p: p.write_text("old"), "requests.csv": lambda p: p.write_text("old"),
                    "steps.csv": lambda p: p.write_text("old")})
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(out)], cwd=ROOT)
    deadline = time.time() + 60
    while not any(p.name.startswith(".run.tmp-") and (p / "requests.csv").exists() for p in tmp_path.iterdir()):
        assert time.time() < deadline and proc.poll() is None, "the writer never started"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert {p.name: p.read_text() for p in out.iterdir() if p.name != MANIFEST} == {
        "summary.json": "old", "requests.csv": "old", "steps.csv": "old"}
    orphans = [p for p in tmp_path.iterdir() if p.name.startswith(".run.tmp-")]
    assert len(orphans) == 1
    write_set(out, {"summary.json": lambda p: p.write_text("newer")})
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.")]
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "summary.json"]


def test_a_live_writers_folder_is_not_an_orphan(tmp_path):
    mine = tmp_path / f".run.tmp-{os.getpid()}-abc"
    mine.mkdir()
    gone = tmp_path / ".run.tmp-999999999-abc"
    gone.mkdir()
    assert clean_orphans(tmp_path, "run") == [gone]
    assert mine.exists() and not gone.exists()
