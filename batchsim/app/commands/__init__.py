"""CLI commands beyond run/cost, one module each, each with ``register(app)``.

Modules here stay import-light (heavy imports inside the command bodies) so
``batchsim --help`` starts fast. :func:`register_all` is called by batchsim.app.cli.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

__all__ = ["register_all"]


def register_all(app: typer.Typer) -> None:
    """Import every module in this package (sorted by name) and register it."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(app)
