"""Environments for multi-turn RL: what answers the policy between its turns.

An episode starts from a prompt record (`reset`), then alternates: the policy writes an assistant message, the
environment answers it (`step`) with messages of its own (tool results, feedback) until it says the episode is
done. `rollout/episodes.py` runs the episodes of a step; the loop sees one rollout per episode, whose environment
tokens are masked out of the loss.

An environment is selected by name (`rollout.env.name`) or as any importable `module:Class`, built once per
episode with the record's fields it needs and `rollout.env.kwargs`.
"""

from dataclasses import dataclass, field
from typing import Protocol

from oxrl_core.errors import OxrlError
from oxrl_core.imports import shipped_or_imported


@dataclass
class EnvStep:
    messages: list[dict] = field(default_factory=list)  # the environment's answer: chat messages (role tool or user)
    done: bool = False
    reward: float | None = None  # the episode's reward, where the environment scores it; None: reward.func does


class Environment(Protocol):
    tools: list[dict]  # the tools it offers, as JSON-schema function specs for the chat template ([] for none)

    def reset(self, record: dict) -> list[dict]:
        """The episode's opening messages (e.g. the record's question as a user message)."""

    def step(self, assistant_text: str) -> EnvStep:
        """Answer the policy's message."""


def question(record: dict) -> list[dict]:
    """The record's `prompt` text as the episode's first (user) message."""
    if not isinstance(record.get("prompt"), str):
        raise ValueError("field 'prompt' must be text: the question that opens the episode")
    return [{"role": "user", "content": record["prompt"]}]


def resolve_env(spec: str, kwargs: dict) -> type:
    """The environment class named by `spec` (a shipped name or `module:Class`), checked to build with `kwargs`."""
    from oxrl_core.envs.calculator import Calculator
    from oxrl_core.envs.guess_number import GuessNumber

    shipped = {"calculator": Calculator, "guess-number": GuessNumber}
    cls = shipped_or_imported(spec, shipped, "rollout.env.name", "environment", list(shipped))
    try:
        cls(**kwargs)
    except TypeError as e:
        raise OxrlError(f"rollout.env.kwargs: {e} (for rollout.env.name={spec!r})") from None
    return cls
