"""The built-in example scenario, so a new user sees real output in one command."""

from __future__ import annotations

from pathlib import Path

__all__ = ["builtin_scenario_path"]


def builtin_scenario_path() -> Path:
    """Path of the packaged example scenario (llama-3-8b chat traffic on an H100)."""
    from batchsim.app.examples import examples_dir

    return examples_dir() / "builtin.yaml"
