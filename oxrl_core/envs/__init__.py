"""Environments for multi-turn RL: what answers the policy between its turns.

An episode starts from a prompt record (`reset`), then alternates: the policy writes an assistant message, the
environment answers it (`step`) with messages of its own (tool results, feedback) until it says the episode is
done. `rollout/episodes.py` runs the episodes of a step; the loop sees one rollout per episode, whose environment
tokens are masked out of the loss.

An environment is selected by name (`rollout.env.name`) or as any importable `module:Class`, built once per
episode with the record's fields it needs and `rollout.env.kwargs`.
"""

from oxrl_core.envs.calculator import Calculator
from oxrl_core.envs.guess_number import GuessNumber
from oxrl_core.errors import OxrlError
from oxrl_core.imports import shipped_or_imported


def resolve_env(spec: str, kwargs: dict) -> type:
    """The environment class named by `spec` (a shipped name or `module:Class`), checked to build with `kwargs`."""
    shipped = {"calculator": Calculator, "guess-number": GuessNumber}
    cls = shipped_or_imported(spec, shipped, "rollout.env.name", "environment", list(shipped))
    try:
        cls(**kwargs)
    except TypeError as e:
        raise OxrlError(f"rollout.env.kwargs: {e} (for rollout.env.name={spec!r})") from None
    return cls
