"""`oxrl train sl|rl`: a run is the harness (`harness.py`) with the recipe its algorithm's record calls for."""

from rich.console import Console

from oxrl_core.algs.base import Algorithm
from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.loops.harness import StepHook, run_recipe
from oxrl_core.loops.recipes.policy_gradient import PolicyGradient
from oxrl_core.loops.recipes.self_play import SelfPlaySupervised
from oxrl_core.loops.recipes.supervised import OfflineSupervised


def train(config: SLConfig | RLConfig, model_path: str, resume: bool, console: Console,
          on_step: StepHook | None = None) -> dict:
    """Train `config` (validated, `model_path` resolved: `loops.preflight`) and return the run's summary."""
    return run_recipe(config, model_path, resume, console, recipe_for(ALGORITHMS[config.train.alg]), on_step)


def recipe_for(algorithm: Algorithm) -> type:
    """The recipe an algorithm's record calls for."""
    return PolicyGradient if algorithm.loop == "rl" else SelfPlaySupervised if algorithm.self_play else OfflineSupervised
