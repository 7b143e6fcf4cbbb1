"""What the clipped policy losses share: PPO's clipped surrogate, and turning per-token losses into one number,
explicitly (docs/design/architecture.md, conventions).

The normalisers count the *global* batch (all micro-batches and ranks), so
summing this over micro-batches gives the loss of the whole batch at once.
"""

from dataclasses import dataclass

import torch

from oxrl_core.algs.base import GlobalBatch, LossArgs
from oxrl_core.algs.settings import LossAgg


def aggregate(
    per_token: torch.Tensor,  # [B, T-1] loss of each predicted token
    mask: torch.Tensor,  # [B, T-1] 1 on response tokens
    mode: LossAgg,
    num_tokens: float,  # response tokens in the global batch
    num_seqs: float,  # sequences in the global batch
    max_tokens: float,  # the constant of Dr. GRPO's token-sum normalisation
) -> torch.Tensor:
    summed = (per_token * mask).sum(-1)  # [B]
    if mode == "token-mean":  # every token of the batch weighs the same (DAPO, CISPO)
        return summed.sum() / num_tokens
    if mode == "seq-mean-token-mean":  # original GRPO: mean over each sequence, then over sequences
        return (summed / mask.sum(-1).clamp(min=1)).sum() / num_seqs
    if mode == "seq-mean-token-sum-norm":  # Dr. GRPO: no length bias from a per-sequence mean
        return (summed / max_tokens).sum() / num_seqs
    raise ValueError(f"unknown loss aggregation {mode!r}")


def clipped_surrogate(
    ratio: torch.Tensor,  # [B, T-1] per token, or [B, 1] per sequence: pi / pi_old
    advantages: torch.Tensor,  # broadcasts against ratio: [B, 1] per sequence or [B, T-1] per token
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic objective as a loss, -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) (Schulman et al.
    2017, arXiv 1707.06347), and 1.0 where the ratio left the clip range."""
    loss = -torch.minimum(ratio * advantages, ratio.clamp(1 - clip_low, 1 + clip_high) * advantages)
    return loss, ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float()


def per_token_means(sums: dict[str, float]) -> dict[str, float]:
    """A policy loss's metrics: each of its sums (`clip_frac_sum`, `kl_ref_sum`, ..., and the trainer's
    `entropy_sum`) as a mean per response token of the batch (`clip_frac`, `kl_ref`, ..., `entropy`)."""
    return {key.removesuffix("_sum"): value / sums["tokens"] for key, value in sums.items() if key.endswith("_sum")}


@dataclass(frozen=True)
class PolicyLossArgs(LossArgs):
    """What every clipped policy loss (SGRPO, CISPO, PPO) takes: its clip range, its aggregation and the normalisers."""

    clip_low: float
    clip_high: float
    loss_agg: LossAgg
    num_tokens: float  # response tokens in the global batch
    num_seqs: float  # samples in the global batch
    max_tokens: float  # rollout.max_tokens: Dr. GRPO's constant

    @staticmethod
    def common(settings, batch: GlobalBatch) -> dict:
        """These fields from the algorithm's settings and the step's batch."""
        return dict(
            clip_low=settings.clip_low,
            clip_high=settings.clip_high,
            loss_agg=settings.loss_agg,
            num_tokens=batch.tokens(),
            num_seqs=batch.sequences(),
            max_tokens=batch.max_tokens,
        )
