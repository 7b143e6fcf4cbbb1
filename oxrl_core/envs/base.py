"""What an environment is (`Environment`), what its step gives (`EnvStep`), and the usual opening of an episode."""

from dataclasses import dataclass, field
from typing import Protocol


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
