"""GRPO as DeepSeekMath defines it (Shao et al. 2024, arXiv 2402.03300, eq. 3), with TRL's `grpo` loss aggregation.

Per token, with r_t = exp(logp_t - old_logp_t) and the group-relative advantage A of its sample:

    -min(r_t A, clip(r_t, 1 - eps, 1 + eps) A) + beta * k3_t,   k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1

averaged over each sample's tokens, then over the samples. The clip is symmetric (eps = clip_low) and the
aggregation fixed; SGRPO (`sgrpo.py`) is the same surrogate with DAPO's asymmetric clip and a chosen aggregation.
"""

from dataclasses import asdict, dataclass
from typing import Annotated

import torch
from pydantic import Field

from oxrl_core.algs.aggregate import clipped_surrogate, per_token_means
from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossArgs, LossResult
from oxrl_core.algs.kl import k3
from oxrl_core.algs.settings import GroupScaling, KLPenalty, PolicyGradient


def grpo_loss(
    logprobs: torch.Tensor,  # [B, T-1] current policy, prediction-aligned
    old_logprobs: torch.Tensor,  # [B, T-1] policy that sampled the tokens
    advantages: torch.Tensor,  # [B] one per sequence
    mask: torch.Tensor,  # [B, T-1] response tokens
    is_weights: torch.Tensor,  # [B, T-1] sampler-trainer correction (correction.py), 1 when off
    ref_logprobs: torch.Tensor | None,  # [B, T-1] frozen reference, or None when kl_coeff == 0
    *,
    clip_low: float,
    kl_coeff: float,
    num_seqs: float,
) -> LossResult:
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T-1]
    per_token, clipped = clipped_surrogate(ratio, advantages[:, None], clip_low, clip_low)  # [B, T-1] each
    per_token = per_token * is_weights
    metrics = {}
    if kl_coeff > 0:
        kl = k3(logprobs, ref_logprobs)  # [B, T-1]
        per_token = per_token + kl_coeff * kl
        metrics["kl_ref_sum"] = (kl * mask).sum().detach()
    per_sequence = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B] token mean of each sample
    return per_sequence.sum() / num_seqs, metrics | {"clip_frac_sum": (clipped * mask).sum()}


@dataclass(frozen=True)
class GRPOArgs(LossArgs):
    clip_low: float  # the clip range, both sides
    kl_coeff: float  # weight of the KL to the reference
    num_seqs: float  # samples in the global batch


def batch_loss(outputs: Batch, batch: Batch, args: GRPOArgs) -> LossResult:
    return grpo_loss(
        outputs["logprobs"],
        batch["old_logprobs"],
        batch["advantages"],
        batch["response_mask"],
        batch["is_weights"],
        batch.get("ref_logprobs"),
        **asdict(args),
    )


class GRPOSettings(PolicyGradient, GroupScaling, KLPenalty):
    fixed = {
        "clip_high": "GRPO clips symmetrically at 1 ± clip_low",
        "loss_agg": "GRPO averages each sample's tokens, then the samples",
    }
    clip_low: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.2, description="The clip of the importance ratio, both sides: 1 ± clip_low."
    )


def make_args(settings: GRPOSettings, batch: GlobalBatch) -> GRPOArgs:
    return GRPOArgs(clip_low=settings.clip_low, kl_coeff=settings.kl_coeff, num_seqs=batch.sequences())


ALGORITHM = Algorithm(
    "grpo",
    "rl",
    "prompts",
    batch_loss,
    make_args,
    per_token_means,
    GRPOSettings,
    reference="kl",
    advantages="group",
    episodes=True,
)
