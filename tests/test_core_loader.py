"""Where the compiled core is loaded from: the package, else the user's own private cache, never elsewhere.

The library is built with the package (setup.py: batchsim/core/_native*.so,
what a wheel carries). A checkout whose _core.c changed since may build it
into the user's cache folder, which must belong to the user and be writable
by nobody else, and so must the library in it. Nothing is compiled into or
loaded from a shared temporary folder (another local user could plant a
library there).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from batchsim import core

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None and not core.packaged_libraries(),
                                reason="neither a compiler nor a packaged core")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """library() as on a first call, with the cache in tmp_path/cache."""
    monkeypatch.setenv("BATCHSIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(core, "_loaded", False)
    monkeypatch.setattr(core, "_lib", None)
    monkeypatch.setattr(core, "_lib_path", None)
    monkeypatch.setattr(core, "_lib_error", None)
    yield tmp_path
    core._loaded = False  # (the next test loads the real one again)


def _reload():
    core._loaded = False
    core._lib = None
    return core.library()


@pytest.mark.skipif(not core.packaged_libraries(), reason="no core was built with the package here")
def test_the_packaged_core_is_used_when_it_was_built_from_this_source(fresh):
    assert core.library() is not None
    assert core.library_path() in core.packaged_libraries()
    assert core.library_path().parent == Path(core.__file__).parent
    assert not (fresh / "cache").exists()  # nothing compiled at run time


def test_without_a_packaged_core_it_is_built_once_into_the_private_cache(fresh, monkeypatch):
    monkeypatch.setattr(core, "packaged_libraries", lambda: [])
    assert core.library() is not None
    cache = fresh / "cache"
    built = list(cache.glob("core-*.so"))
    assert len(built) == 1 and core.library_path() == built[0]
    assert (cache.stat().st_mode & 0o077) == 0 and (built[0].stat().st_mode & 0o022) == 0
    assert _reload() is not None and list(cache.glob("core-*.so")) == built  # reused, not rebuilt


def test_a_stale_packaged_core_is_not_used(fresh, monkeypatch):
    """A checkout whose _core.c changed after the build: the packaged library says another source."""
    monkeypatch.setattr(core, "source_key", lambda src: "0123456789abcdef")
    monkeypatch.setenv("CC", str(fresh / "no-such-cc"))
    assert core.library() is None
    err = core.library_error()
    assert "no-such-cc" in err
    if core.packaged_libraries():
        assert "built from another source" in err


def test_a_cache_folder_others_can_write_is_refused(fresh, monkeypatch):
    monkeypatch.setattr(core, "packaged_libraries", lambda: [])
    cache = fresh / "cache"
    cache.mkdir(mode=0o700)
    os.chmod(cache, 0o777)
    assert core.library() is None
    assert "writable by others" in core.library_error() and not list(cache.glob("*.so"))


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown needs root")
def test_a_cache_folder_or_library_of_another_user_is_refused(fresh, monkeypatch):
    monkeypatch.setattr(core, "packaged_libraries", lambda: [])
    assert core.library() is not None  # builds one
    lib = core.library_path()
    os.chown(lib, 65534, 65534)
    assert _reload() is None and "belongs to uid 65534" in core.library_error()
    os.chown(lib, 0, 0)
    os.chown(lib.parent, 65534, 65534)
    assert _reload() is None and "cache folder" in core.library_error()


def test_a_library_planted_in_the_temporary_folder_is_never_loaded(fresh, monkeypatch):
    """The old loader fell back to <tmp>/batchsim-<uid>/core-<hash>.so and loaded whatever was there."""
    real = core.library()
    assert real is not None
    planted_dir = Path(tempfile.gettempdir()) / f"batchsim-{os.getuid() if hasattr(os, 'getuid') else 0}"
    planted_dir.mkdir(exist_ok=True)
    key = core.source_key(core._SOURCE.read_bytes())
    planted = planted_dir / f"core-{key}.so"
    shutil.copy(core.library_path(), planted)
    try:
        monkeypatch.setattr(core, "packaged_libraries", lambda: [])
        monkeypatch.setenv("CC", str(fresh / "no-such-cc"))
        monkeypatch.setenv("BATCHSIM_CACHE", str(fresh / "empty-cache"))
        assert _reload() is None
        assert core.library_path() is None or core.library_path() != planted
    finally:
        planted.unlink()


def test_without_a_compiler_or_core_auto_runs_python_and_says_why(fresh, monkeypatch):
    from batchsim.app.config import scenario_from_dict
    from batchsim.app.runner import run_scenario

    monkeypatch.setattr(core, "packaged_libraries", lambda: [])
    monkeypatch.setenv("CC", "/bin/false")
    res = run_scenario(scenario_from_dict({
        "model": "llama-3-8b", "hardware": "h100-sxm", "policy": {"name": "continuous"},
        "workload": {"num_requests": 10, "arrival": {"process": "poisson", "rate": 5.0},
                     "prompt_tokens": {"dist": "fixed", "value": 100},
                     "output_tokens": {"dist": "fixed", "value": 10}}}))
    assert res.summary["engine"] == "python"
    assert "the compiled core could not be built" in res.summary["engine_reason"]
    assert "installed without its compiled core" in res.summary["engine_reason"]


def test_a_symlinked_cache_folder_or_library_is_refused(fresh, monkeypatch):
    monkeypatch.setattr(core, "packaged_libraries", lambda: [])
    real = fresh / "real-cache"
    real.mkdir(mode=0o700)
    (fresh / "cache").symlink_to(real)
    assert core.library() is None and "symlink" in core.library_error()
    (fresh / "cache").unlink()
    assert _reload() is not None  # builds into a real folder
    lib = core.library_path()
    moved = fresh / "elsewhere.so"
    lib.rename(moved)
    lib.symlink_to(moved)  # the library is now a symlink to a file of the user's
    assert _reload() is None and "symlink is not loaded" in core.library_error()


def test_a_cache_below_a_folder_others_can_write_is_refused(fresh, monkeypatch):
    monkeypatch.setattr(core, "packaged_libraries", lambda: [])
    shared = fresh / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # world-writable, not sticky: anyone could swap the folder below it
    monkeypatch.setenv("BATCHSIM_CACHE", str(shared / "cache"))
    assert core.library() is None and "writable by others and not sticky" in core.library_error()
    os.chmod(shared, 0o1777)  # sticky, like /tmp: entries can only be replaced by their owner
    assert _reload() is not None
