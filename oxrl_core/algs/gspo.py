"""GSPO, group sequence policy optimisation (Zheng et al. 2025, arXiv 2507.18071).

The importance ratio is the sample's, normalised by its length, s_i = exp(mean_t (logp_t - old_t)) (the geometric
mean of its token ratios), and the clip acts on samples, not tokens:

    -min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i), averaged over the samples (no KL term).

A sequence's ratio sits much closer to 1 than a token's, so the clip is narrow: 3e-4 and 4e-4 unless set (the
paper's). GSPO-token (`gspo_token.py`) keeps the value s_i on every token but lets each token's gradient through on
its own, s_i,t = sg(s_i) exp(logp_t - sg(logp_t)), for advantages that differ per token; with one advantage per
sample its gradient is GSPO's.
"""

from dataclasses import asdict, dataclass
from typing import Annotated

import torch
from pydantic import Field

from oxrl_core.algs.aggregate import clipped_surrogate, per_token_means
from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossArgs, LossResult
from oxrl_core.algs.settings import Clip, GroupScaling, PolicyGradient


def gspo_loss(
    logprobs: torch.Tensor,  # [B, T-1] current policy, prediction-aligned
    old_logprobs: torch.Tensor,  # [B, T-1] policy that sampled the tokens
    advantages: torch.Tensor,  # [B] one per sequence
    mask: torch.Tensor,  # [B, T-1] response tokens
    is_weights: torch.Tensor,  # [B, T-1] sampler-trainer correction (correction.py), 1 when off
    *,
    clip_low: float,
    clip_high: float,
    num_seqs: float,
    token_gradients: bool,
) -> LossResult:
    lengths = mask.sum(-1).clamp(min=1)  # [B]
    log_s = (((logprobs - old_logprobs) * mask).sum(-1) / lengths)[:, None]  # [B, 1] mean log ratio of each sample
    if token_gradients:  # GSPO-token: the value of s_i, each token's own gradient
        log_s = log_s.detach() + logprobs - logprobs.detach()  # [B, T-1]
    per_token, clipped = clipped_surrogate(
        torch.exp(log_s), advantages[:, None], clip_low, clip_high
    )  # [B, 1] or [B, T-1]
    per_sample = (per_token * is_weights * mask).sum(-1) / lengths  # [B]
    return per_sample.sum() / num_seqs, {"clip_frac_sum": (clipped * mask).sum()}


@dataclass(frozen=True)
class GSPOArgs(LossArgs):
    clip_low: float
    clip_high: float
    num_seqs: float  # samples in the global batch
    token_gradients: bool  # GSPO-token


def batch_loss(outputs: Batch, batch: Batch, args: GSPOArgs) -> LossResult:
    return gspo_loss(
        outputs["logprobs"],
        batch["old_logprobs"],
        batch["advantages"],
        batch["response_mask"],
        batch["is_weights"],
        **asdict(args),
    )


class GSPOSettings(PolicyGradient, GroupScaling, Clip):
    """GSPO has no KL term; its clip acts on a sample's ratio, much nearer 1 than a token's."""

    fixed = {"loss_agg": "GSPO's loss is a mean over samples by definition"}
    clip_low: Annotated[float, Field(ge=0, lt=1)] = Field(
        3e-4, description="Lower clip of the sample's ratio: 1 - clip_low."
    )
    clip_high: Annotated[float, Field(ge=0)] = Field(
        4e-4, description="Upper clip of the sample's ratio: 1 + clip_high."
    )


def make_args(settings: GSPOSettings, batch: GlobalBatch) -> GSPOArgs:
    return GSPOArgs(
        clip_low=settings.clip_low, clip_high=settings.clip_high, num_seqs=batch.sequences(), token_gradients=False
    )


ALGORITHM = Algorithm(
    "gspo", "rl", "prompts", batch_loss, make_args, per_token_means, GSPOSettings, advantages="group", episodes=True
)
