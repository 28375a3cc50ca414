"""The example plugin (examples/ci/plugin), installed and found by entry point.

The package is installed with ``pip install --no-deps --target`` into a
temporary folder (dist-info included, so ``importlib.metadata`` sees its
``batchsim.policies`` entry point) and used from subprocesses whose
PYTHONPATH names that folder: the test venv is never modified. The scenario
names the policy ``spf`` only, so it can only be found through the entry
point — without the install the same command fails as an unknown policy.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "ci" / "plugin"
SCENARIO = "scenarios/spf-chat.yaml"
BASELINE = "regress-baseline.json"
RERECORD = """
The example plugin's committed baseline no longer matches. If the engine or
cost model changed on purpose, re-record it (and baselines/baseline.json):
  pip install --no-deps --target /tmp/spf examples/ci/plugin && rm -rf examples/ci/plugin/build examples/ci/plugin/*.egg-info
  PYTHONPATH=/tmp/spf batchsim regress examples/ci/plugin/scenarios/*.yaml \\
      --baseline examples/ci/plugin/regress-baseline.json --update --seeds 1
"""


def batchsim(*args: str, cwd: Path, site: Path | None) -> subprocess.CompletedProcess:
    """The console script in a subprocess; ``site`` (the --target install) goes first on the path."""
    paths = ([str(site)] if site else []) + [str(ROOT)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), COLUMNS="200")
    return subprocess.run([sys.executable, "-c", "from batchsim.app.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The plugin installed (not by path) into a throwaway --target folder."""
    tmp = tmp_path_factory.mktemp("plugin")
    src = tmp / "src"
    # NOTE: build from a copy, so setuptools' build/ and *.egg-info never land in the repo.
    shutil.copytree(PLUGIN, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp / "site"
    # NOTE: building offline needs setuptools in this venv; without it (a fresh
    # Python >= 3.12 venv) let pip fetch it into an isolated build env instead.
    offline = importlib.util.find_spec("setuptools") is not None
    flags = ["--no-build-isolation", "--no-index"] if offline else []
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *flags,
                        "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.fail(f"pip could not install the example plugin:\n{r.stdout}\n{r.stderr}")
    assert list(target.glob("batchsim_spf-*.dist-info"))
    return target


@pytest.fixture
def project(tmp_path) -> Path:
    """The plugin's scenario and committed baseline, copied (same layout: keys stay valid)."""
    d = tmp_path / "project"
    (d / "scenarios").mkdir(parents=True)
    shutil.copy(PLUGIN / SCENARIO, d / SCENARIO)
    shutil.copy(PLUGIN / BASELINE, d / BASELINE)
    return d


def test_entry_point_is_discovered(site, tmp_path):
    code = ("from importlib.metadata import entry_points; from batchsim.policies import policy_names, policy_class;"
            "eps = {e.name: e.value for e in entry_points(group='batchsim.policies')};"
            "print(eps['spf'], 'spf' in policy_names(), policy_class('spf').__module__)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["spf_policy:ShortestPromptFirst", "True", "spf_policy.policy"]


def test_not_installed_means_unknown_policy(project):
    r = batchsim("regress", SCENARIO, "--baseline", BASELINE, cwd=project, site=None)
    assert r.returncode == 2 and "unknown policy 'spf'" in r.stderr, r.stderr


def test_committed_baseline_passes_then_worse_plugin_fails(site, project, tmp_path):
    # NOTE: --seeds 1 (the baseline is recorded so): at this knee scenario median TTFT's 5-seed
    # interval is about ±75%, so the interval gate at 5 seeds cannot see this +21% regression.
    r = batchsim("regress", SCENARIO, "--baseline", BASELINE, "--seeds", "1", cwd=project, site=site)
    assert r.returncode == 0, (r.stdout + r.stderr + RERECORD)
    assert "OK: no regressions" in r.stdout

    # A deliberately worse release of the plugin: longest prompt first.
    worse = tmp_path / "worse-site"
    shutil.copytree(site, worse, ignore=shutil.ignore_patterns("__pycache__"))
    policy = worse / "spf_policy" / "policy.py"
    text = policy.read_text()
    assert text.count("s.prompt_tokens))") == 1
    policy.write_text(text.replace("s.prompt_tokens))", "-s.prompt_tokens))"))
    r = batchsim("regress", SCENARIO, "--baseline", BASELINE, "--seeds", "1", "--junit", "junit.xml",
                 cwd=project, site=worse)
    assert r.returncode == 1, r.stdout + r.stderr
    regressed = [ln for ln in r.stdout.splitlines() if ln.startswith(f"REGRESSED {SCENARIO}: ")]
    for metric in ("median_ttft_ms", "request_goodput"):  # both move by >10% in this scenario
        assert any(ln.startswith(f"REGRESSED {SCENARIO}: {metric}: ") and " -> " in ln for ln in regressed), r.stdout
    assert "\nSCENARIO " not in "\n" + r.stdout  # same inputs (no hash mismatch): a real regression
    assert (project / "junit.xml").read_text().count("<failure") == len(regressed)
