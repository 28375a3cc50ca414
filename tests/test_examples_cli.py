"""`batchsim examples`: the packaged examples and baselines, listed, printed, written out.

The README's commands must work from a folder that ``batchsim examples --all``
filled, without a checkout: each command here runs in a subprocess whose
working directory is that folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "batchsim"


def batchsim(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    return subprocess.run([sys.executable, "-c", "from batchsim.app.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def _packaged(kind: str) -> set[str]:
    base = PKG / kind
    return {p.relative_to(base).as_posix() for p in base.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")}


def test_checkout_links_point_into_the_package():
    for kind in ("examples", "baselines"):
        link = ROOT / kind
        assert link.is_symlink() and os.readlink(link) == f"batchsim/{kind}"
        assert link.resolve() == (PKG / kind).resolve()
    assert (PKG / "examples" / "builtin.yaml").is_file()


def test_list_names_every_example_and_baseline(tmp_path):
    r = batchsim("examples", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for stem in ("builtin", "continuous", "chunked_prefill", "dynamic", "static", "plan-chat",
                 "llama70b-tp4-cluster"):
        assert f"  {stem} " in r.stdout
    assert "vLLM-v0-style continuous batching" in r.stdout  # the first comment line
    for stem in ("continuous", "continuous_mixed", "static"):
        assert f"baselines/{stem} " in r.stdout
    assert "baselines/baseline.json" in r.stdout and "examples/ci/regress.yml" in r.stdout
    assert list(tmp_path.iterdir()) == []  # listing writes nothing


def test_print_one_is_the_packaged_yaml(tmp_path):
    r = batchsim("examples", "continuous", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (PKG / "examples" / "continuous.yaml").read_text()
    r = batchsim("examples", "baselines/static.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (PKG / "baselines" / "static.yaml").read_text()


def test_write_one_and_refuse_to_overwrite(tmp_path):
    r = batchsim("examples", "dynamic", "--out", "sc", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "sc" / "dynamic.yaml"
    assert dest.read_bytes() == (PKG / "examples" / "dynamic.yaml").read_bytes()

    dest.write_text("# mine\n")
    r = batchsim("examples", "dynamic", "--out", "sc", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("error:") and "sc/dynamic.yaml" in r.stderr and "--force" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert dest.read_text() == "# mine\n"

    r = batchsim("examples", "dynamic", "--out", "sc", "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert dest.read_bytes() == (PKG / "examples" / "dynamic.yaml").read_bytes()


def test_unknown_name_lists_the_known_ones(tmp_path):
    r = batchsim("examples", "contiguous", cwd=tmp_path)
    assert r.returncode == 2
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert "'contiguous'" in line and "continuous" in line and "baselines/static" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["--all"], ["--out", "x"], ["static", "--all", "--out", "x"]])
def test_bad_combinations_are_one_line_errors(tmp_path, args):
    r = batchsim("examples", *args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_all_writes_a_folder_where_the_readme_commands_work(tmp_path):
    r = batchsim("examples", "--all", "--out", ".", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for kind in ("examples", "baselines"):
        assert _packaged(kind) <= {p.relative_to(tmp_path / kind).as_posix()
                                   for p in (tmp_path / kind).rglob("*") if p.is_file()}
    assert (tmp_path / "examples" / "ci" / "plugin" / "spf_policy" / "policy.py").is_file()
    assert (tmp_path / "examples" / "ci" / "regress.yml").is_file()

    r = batchsim("run", "examples/continuous.yaml", "--set", "workload.num_requests=50", "--json",
                 "--out", "runs/c", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["num_requests"] == 50
    assert (tmp_path / "runs" / "c" / "summary.json").is_file()

    r = batchsim("regress", *sorted(p.relative_to(tmp_path).as_posix()
                                    for p in (tmp_path / "baselines").glob("*.yaml")),
                 "--baseline", "baselines/baseline.json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "OK: no regressions" in r.stdout


def test_all_refuses_a_clash_and_writes_nothing(tmp_path):
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "baseline.json").write_text("{}")
    r = batchsim("examples", "--all", "--out", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2
    assert "baselines/baseline.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "examples").exists()
    assert (tmp_path / "baselines" / "baseline.json").read_text() == "{}"

    r = batchsim("examples", "--all", "--out", str(tmp_path), "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "baselines" / "baseline.json").read_text())["scenarios"]


def test_library_finds_the_packaged_files():
    from batchsim.app.builtin import builtin_scenario_path
    from batchsim.app.examples import examples_dir, list_baselines, list_examples

    assert examples_dir().resolve() == (PKG / "examples").resolve()
    assert builtin_scenario_path().is_file()
    names = [e.name for e in list_examples()]
    assert "builtin" in names and all(e.description for e in list_examples() + list_baselines())
