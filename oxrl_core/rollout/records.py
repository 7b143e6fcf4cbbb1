"""What sampling hands over: a request to an engine, its completion, and the rollout a loop trains on; and the
seeds that make every sample's random stream its own."""

from dataclasses import dataclass

import numpy as np


@dataclass
class Rollout:
    """One sampled completion: enough to replay a training step (docs/design/architecture.md, conventions)."""

    group: int  # index of the prompt in this step's batch
    prompt_ids: list[int]
    response_ids: list[int]
    sampler_logprobs: list[float]  # vLLM's log p of each response token
    finish_reason: str  # "stop" (EOS or stop string) or "length" (truncated)
    policy_version: int
    reward: float = 0.0
    media: tuple[
        np.ndarray, ...
    ] = ()  # the prompt's images or audio clips (data/media.py; set by the pool, which has them)
    # An episode (rollout/episodes.py): 1 where the policy sampled the response token, 0 where the environment or
    # the chat template put it; None: every token was sampled.
    policy_mask: list[int] | None = None
    env_reward: float | None = None  # the environment's score of the episode, where it gave one
    # Where the weights changed mid-sample (an asynchronous run): (policy version, index of the first response token
    # it sampled) for each; empty: every token is policy_version's.
    version_starts: tuple[tuple[int, int], ...] = ()
    # A mixture of experts: the experts each MoE layer chose for each token the engine ran, [prompt + response - 1,
    # layers, k] int16 (rollout/routes.py: -1 where none was recorded), for router replay; None: a dense model.
    routes: np.ndarray | None = None

    @classmethod
    def of(cls, done: "Completion", group: int, prompt_ids: list[int], media: tuple = ()) -> "Rollout":
        """A single-turn sample from its completion."""
        return cls(
            group,
            list(prompt_ids),
            done.token_ids,
            done.logprobs,
            done.finish_reason,
            done.policy_version,
            media=media,
            version_starts=tuple(done.version_starts) if len(done.version_starts) > 1 else (),
            routes=done.routes,
        )

    @property
    def answer_ids(self) -> list[int]:
        """What a reward reads: the response, or an episode's last policy message."""
        if self.policy_mask is None:
            return self.response_ids
        end = max(i for i, sampled in enumerate(self.policy_mask) if sampled) + 1
        start = end
        while start > 0 and self.policy_mask[start - 1]:
            start -= 1
        return self.response_ids[start:end]


@dataclass
class SampleRequest:
    """One sample to draw: a prompt and how."""

    key: int  # the caller's name for it, unique among the engine's requests
    prompt_ids: list[int]
    max_tokens: int
    seed: int
    temperature: float
    top_p: float
    media: tuple[
        np.ndarray, ...
    ] = ()  # images or audio clips (data/media.py), their placeholders expanded in prompt_ids


@dataclass
class Completion:
    """A finished SampleRequest."""

    key: int
    token_ids: list[int]
    logprobs: list[float]  # the sampler's log p of each token
    finish_reason: str  # "stop" or "length"
    # (policy version, index of the first token it sampled): one entry unless the weights changed mid-sample
    version_starts: list[tuple[int, int]]
    routes: np.ndarray | None = None  # a mixture of experts': its prompt's and response's routes (`Rollout.routes`)

    @property
    def policy_version(self) -> int:
        """The version of its first tokens: the oldest."""
        return self.version_starts[0][0]


def round_seed(run_seed: int, step: int, sampling_round: int = 0) -> int:
    """The `seed_base` of one sampling round of a step (or of a self-play iteration): its own for every (run seed,
    step, round). The primes keep them apart: run seed s at step t + 1 never meets run seed s + 1 at step t, nor a
    round of one step another step's first."""
    return run_seed * 1_000_003 + step + sampling_round * 500_009


def sample_seed(seed_base: int, prompt: int, n: int, j: int) -> int:
    """The seed of prompt `prompt`'s j-th of `n` samples: every sample its own random stream (vLLM seeds a request
    of n with seed + j, so prompts are spaced by n)."""
    return (seed_base * 100_003 + prompt) * n + j
