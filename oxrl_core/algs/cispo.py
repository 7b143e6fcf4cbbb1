"""CISPO: clipped importance-sampling weights, REINFORCE-style (MiniMax-M1, arXiv 2506.13585).

Per token: -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A * logp_t. The weight is clipped and
detached, never the token: unlike PPO, tokens outside the trust region still pass a gradient.
"""

from dataclasses import asdict

import torch

from oxrl_core.algs.aggregate import LossAgg, PolicyLossArgs, aggregate, per_token_means
from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossResult
from oxrl_core.algs.settings import Aggregation, Clip, GroupScaling, PolicyGradient


def cispo_loss(
    logprobs: torch.Tensor,  # [B, T-1] current policy, prediction-aligned
    old_logprobs: torch.Tensor,  # [B, T-1] policy that sampled the tokens
    advantages: torch.Tensor,  # [B] one per sequence
    mask: torch.Tensor,  # [B, T-1] response tokens
    is_weights: torch.Tensor,  # [B, T-1] sampler-trainer correction (correction.py), 1 when off
    *,
    clip_low: float,
    clip_high: float,
    loss_agg: LossAgg,
    num_tokens: float,
    num_seqs: float,
    max_tokens: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ratio = torch.exp(logprobs - old_logprobs)
    weight = ratio.clamp(1 - clip_low, 1 + clip_high).detach()
    per_token = -weight * advantages[:, None] * logprobs * is_weights
    loss = aggregate(per_token, mask, loss_agg, num_tokens, num_seqs, max_tokens)
    clipped = ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float()
    return loss, {"clip_frac_sum": (clipped * mask).sum()}


def batch_loss(outputs: Batch, batch: Batch, args: PolicyLossArgs) -> LossResult:
    return cispo_loss(
        outputs["logprobs"],
        batch["old_logprobs"],
        batch["advantages"],
        batch["response_mask"],
        batch["is_weights"],
        **asdict(args),
    )


class CISPOSettings(PolicyGradient, GroupScaling, Aggregation, Clip):
    """CISPO's clip bounds the importance weight, not the token's gradient; it has no KL term."""


def make_args(settings: CISPOSettings, batch: GlobalBatch) -> PolicyLossArgs:
    return PolicyLossArgs(**PolicyLossArgs.common(settings, batch))


ALGORITHM = Algorithm(
    "cispo", "rl", "prompts", batch_loss, make_args, per_token_means, CISPOSettings, advantages="group", episodes=True
)
