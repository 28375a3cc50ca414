"""The built-in policies' common class: a recipe, interpreted.

A :class:`RecipePolicy` states its rules once, as a frozen recipe built from
its validated config (:meth:`RecipePolicy.make_recipe`), and its
``schedule`` is the shipped interpreter of that recipe:
:func:`batchsim.policies.step.run_iteration` for an
:class:`~batchsim.policies.recipe.IterationRecipe`, :func:`batchsim.policies.padded.run_padded`
for a :class:`~batchsim.policies.recipe.PaddedRecipe`. The compiled core interprets
the same recipe in C, so a policy that changes its recipe changes both
engines' results alike; a class that overrides ``schedule`` is an ordinary
policy and runs on the SimPy engine.
"""

from __future__ import annotations

from batchsim.policies.base import PolicyBase, PolicyConfig
from batchsim.policies.padded import run_padded
from batchsim.policies.recipe import IterationRecipe, PaddedRecipe, Recipe
from batchsim.policies.step import run_iteration
from batchsim.sim.protocols import ReplicaView
from batchsim.sim.types import BatchPlan

__all__ = ["RecipePolicy", "interpret"]


def interpret(recipe: Recipe, view: ReplicaView) -> BatchPlan:
    """One scheduling decision by ``recipe`` (the Python interpreter of the built-in rules)."""
    if isinstance(recipe, IterationRecipe):
        return run_iteration(recipe, view)
    if isinstance(recipe, PaddedRecipe):
        return run_padded(recipe, view)
    raise TypeError(f"not a recipe: {recipe!r}")


class RecipePolicy(PolicyBase):
    """A policy whose rules are a recipe; subclasses say how their config makes it."""

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self.recipe: Recipe = self.make_recipe()

    def make_recipe(self) -> Recipe:
        """The recipe of this policy's config."""
        raise NotImplementedError

    def schedule(self, view: ReplicaView) -> BatchPlan:
        """One step by the recipe."""
        return interpret(self.recipe, view)
