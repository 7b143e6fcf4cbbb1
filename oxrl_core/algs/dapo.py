"""DAPO: decoupled clip and dynamic sampling policy optimisation (Yu et al. 2025, arXiv 2503.14476).

Per token: -min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A), summed over every response token of the batch and
divided by their number (token-level: each token of a long answer weighs what one of a short answer does), with no
KL term. Clip-higher: clip_high (0.28) above clip_low (0.2) lets unlikely tokens gain probability, against entropy
collapse. The rest of DAPO is data, not loss: the record asks for dynamic sampling (a group whose rewards are all
equal has zero advantages; it is dropped and refilled from further prompts), and its example config turns on the
soft overlong penalty (`reward.overlong_buffer`).
"""

from dataclasses import asdict, dataclass

import torch
from pydantic import Field

from oxrl_core.algs.aggregate import clipped_surrogate, per_token_means
from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossArgs, LossResult
from oxrl_core.algs.settings import Clip, GroupScaling, PolicyGradient, PositiveInt


def dapo_loss(
    logprobs: torch.Tensor,  # [B, T-1] current policy, prediction-aligned
    old_logprobs: torch.Tensor,  # [B, T-1] policy that sampled the tokens
    advantages: torch.Tensor,  # [B] one per sequence
    mask: torch.Tensor,  # [B, T-1] response tokens
    is_weights: torch.Tensor,  # [B, T-1] sampler-trainer correction (correction.py), 1 when off
    *,
    clip_low: float,
    clip_high: float,
    num_tokens: float,
) -> LossResult:
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T-1]
    per_token, clipped = clipped_surrogate(ratio, advantages[:, None], clip_low, clip_high)  # [B, T-1] each
    return (per_token * is_weights * mask).sum() / num_tokens, {"clip_frac_sum": (clipped * mask).sum()}


@dataclass(frozen=True)
class DAPOArgs(LossArgs):
    clip_low: float
    clip_high: float
    num_tokens: float  # response tokens in the global batch


def batch_loss(outputs: Batch, batch: Batch, args: DAPOArgs) -> LossResult:
    return dapo_loss(
        outputs["logprobs"],
        batch["old_logprobs"],
        batch["advantages"],
        batch["response_mask"],
        batch["is_weights"],
        **asdict(args),
    )


class DAPOSettings(PolicyGradient, GroupScaling, Clip):
    """DAPO has no KL term."""

    fixed = {"loss_agg": "DAPO's loss is token-level by definition"}
    max_sampling_rounds: PositiveInt = Field(
        4,
        description="Dynamic sampling: generation rounds a step may take to fill "
        "its batch with prompt groups whose rewards differ; a step "
        "still short after them stops the run.",
    )


def make_args(settings: DAPOSettings, batch: GlobalBatch) -> DAPOArgs:
    return DAPOArgs(clip_low=settings.clip_low, clip_high=settings.clip_high, num_tokens=batch.tokens())


ALGORITHM = Algorithm(
    "dapo",
    "rl",
    "prompts",
    batch_loss,
    make_args,
    per_token_means,
    DAPOSettings,
    advantages="group",
    episodes=True,
    dynamic_sampling=True,
)
