"""REINFORCE++ (Hu et al. 2025, arXiv 2501.03262), as in the paper and OpenRLHF.

No critic and no per-prompt baseline: the KL to the reference is in the reward, per token
(r_t = -kl_coeff (old_t - ref_t), plus the sample's reward on its last token), the advantage of a token is its
discounted return (`gamma`), normalised over every response token of the batch (`advantages.reinforce_pp`),
and the loss is PPO's clipped surrogate per token, aggregated by `loss_agg`:

    -min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t)

`reinforce++-baseline` (`reinforce_pp_baseline.py`) subtracts each prompt's mean reward first.
"""

from dataclasses import asdict
from typing import Annotated

import torch
from pydantic import Field

from oxrl_core.algs.aggregate import LossAgg, PolicyLossArgs, aggregate, clipped_surrogate, per_token_means
from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossResult
from oxrl_core.algs.settings import Aggregation, Clip, Discount, KLPenalty, PolicyGradient, Whitening


def reinforce_pp_loss(
    logprobs: torch.Tensor,  # [B, T-1] current policy, prediction-aligned
    old_logprobs: torch.Tensor,  # [B, T-1] policy that sampled the tokens
    advantages: torch.Tensor,  # [B, T-1] one per token
    mask: torch.Tensor,  # [B, T-1] response tokens
    is_weights: torch.Tensor,  # [B, T-1] sampler-trainer correction (correction.py), 1 when off
    *,
    clip_low: float,
    clip_high: float,
    loss_agg: LossAgg,
    num_tokens: float,
    num_seqs: float,
    max_tokens: float,
) -> LossResult:
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T-1]
    per_token, clipped = clipped_surrogate(ratio, advantages, clip_low, clip_high)  # [B, T-1] each
    loss = aggregate(per_token * is_weights, mask, loss_agg, num_tokens, num_seqs, max_tokens)
    return loss, {"clip_frac_sum": (clipped * mask).sum()}


def batch_loss(outputs: Batch, batch: Batch, args: PolicyLossArgs) -> LossResult:
    return reinforce_pp_loss(
        outputs["logprobs"],
        batch["old_logprobs"],
        batch["advantages"],
        batch["response_mask"],
        batch["is_weights"],
        **asdict(args),
    )


class ReinforcePPSettings(PolicyGradient, Discount, Whitening, Aggregation, KLPenalty, Clip):
    """The KL to the reference is a per-token penalty in the reward."""

    clip_high: Annotated[float, Field(ge=0)] = Field(
        0.2, description="Upper clip of the importance ratio: 1 + clip_high (OpenRLHF's symmetric clip)."
    )


def make_args(settings: ReinforcePPSettings, batch: GlobalBatch) -> PolicyLossArgs:
    return PolicyLossArgs(**PolicyLossArgs.common(settings, batch))


# Episodes: a token's return across environment turns would credit the environment's tokens; not built.
ALGORITHM = Algorithm(
    "reinforce++",
    "rl",
    "prompts",
    batch_loss,
    make_args,
    per_token_means,
    ReinforcePPSettings,
    reference="kl",
    advantages="reinforce++",
)
