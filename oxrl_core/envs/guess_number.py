"""Guess the number: the record holds a secret whole number (`answer`); after each guess the environment says
"higher" or "lower", and the episode ends when the policy names it. Its reward (`reward.func: env`) is 1 for a
found number and 0 for an episode cut short (`rollout.max_turns`, the token budget): a task the policy can only
solve by reading the environment's feedback.
"""

import re

from oxrl_core.envs.base import EnvStep, question

_INTEGER = re.compile(r"-?\d{1,12}")  # a hostile 5,000-digit number is read as 12-digit pieces, not parsed whole


class GuessNumber:
    tools: list[dict] = []

    def reset(self, record: dict) -> list[dict]:
        if not str(record.get("answer", "")).lstrip("-").isdigit():
            raise ValueError(f"field 'answer' must be the secret whole number, got {str(record.get('answer'))[:20]!r}")
        self.secret = int(record["answer"])
        return question(record)

    def step(self, assistant_text: str) -> EnvStep:
        numbers = _INTEGER.findall(assistant_text)
        if not numbers:
            return EnvStep([{"role": "user", "content": "Answer with one whole number."}])
        guess = int(numbers[-1])
        if guess == self.secret:
            return EnvStep(done=True, reward=1.0)
        return EnvStep([{"role": "user", "content": "higher" if guess < self.secret else "lower"}])
