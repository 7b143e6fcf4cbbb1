"""`oxrl train sl|rl`: a run is the harness (`harness.py`) with the recipe its algorithm's record calls for."""

from rich.console import Console

from oxrl_core.algs.base import Algorithm
from oxrl_core.loops.harness import StepHook, run_recipe
from oxrl_core.loops.recipes.policy_gradient import PolicyGradient
from oxrl_core.loops.recipes.self_play import SelfPlaySupervised
from oxrl_core.loops.recipes.supervised import OfflineSupervised
from oxrl_core.resolve.run import ResolvedRun


def train(run: ResolvedRun, resume: bool, console: Console, on_step: StepHook | None = None) -> dict:
    """Train a resolved run (`oxrl_core.resolve`) and return its summary."""
    return run_recipe(run, resume, console, recipe_for(run.algorithm), on_step)


def recipe_for(algorithm: Algorithm) -> type:
    """The recipe an algorithm's record calls for."""
    return (
        PolicyGradient if algorithm.loop == "rl" else SelfPlaySupervised if algorithm.self_play else OfflineSupervised
    )
