"""SGRPO, stable GRPO: PPO's clipped surrogate on group-relative advantages, plus an optional k3 KL term.

GRPO: Shao et al. 2024, DeepSeekMath (arXiv 2402.03300). Deliberate deviations from the paper:
asymmetric clipping (1 - clip_low, 1 + clip_high, as in DAPO, arXiv 2503.14476) and an
explicit aggregation mode (the paper's is `seq-mean-token-mean`).
"""

from dataclasses import asdict, dataclass

import torch

from oxrl_core.algs.aggregate import LossAgg, PolicyLossArgs, aggregate, clipped_surrogate, per_token_means
from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossResult
from oxrl_core.algs.kl import k3
from oxrl_core.algs.settings import Aggregation, Clip, GroupScaling, KLPenalty, PolicyGradient


def sgrpo_loss(
    logprobs: torch.Tensor,  # [B, T-1] current policy, prediction-aligned
    old_logprobs: torch.Tensor,  # [B, T-1] policy that sampled the tokens
    advantages: torch.Tensor,  # [B] one per sequence
    mask: torch.Tensor,  # [B, T-1] response tokens
    is_weights: torch.Tensor,  # [B, T-1] sampler-trainer correction (correction.py), 1 when off
    ref_logprobs: torch.Tensor | None,  # [B, T-1] frozen reference, or None when kl_coeff == 0
    *,
    clip_low: float,
    clip_high: float,
    kl_coeff: float,
    loss_agg: LossAgg,
    num_tokens: float,
    num_seqs: float,
    max_tokens: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T-1]
    per_token, clipped = clipped_surrogate(ratio, advantages[:, None], clip_low, clip_high)  # [B, T-1] each
    per_token = per_token * is_weights
    metrics = {}
    if kl_coeff > 0:
        kl = k3(logprobs, ref_logprobs)  # [B, T-1]
        per_token = per_token + kl_coeff * kl
        metrics["kl_ref_sum"] = (kl * mask).sum().detach()
    loss = aggregate(per_token, mask, loss_agg, num_tokens, num_seqs, max_tokens)
    metrics["clip_frac_sum"] = (clipped * mask).sum()
    return loss, metrics


@dataclass(frozen=True)
class SGRPOArgs(PolicyLossArgs):
    kl_coeff: float


def batch_loss(outputs: Batch, batch: Batch, args: SGRPOArgs) -> LossResult:
    return sgrpo_loss(
        outputs["logprobs"],
        batch["old_logprobs"],
        batch["advantages"],
        batch["response_mask"],
        batch["is_weights"],
        batch.get("ref_logprobs"),
        **asdict(args),
    )


class SGRPOSettings(PolicyGradient, GroupScaling, Aggregation, KLPenalty, Clip):
    """The k3 KL term to the reference joins the loss when kl_coeff > 0."""


def make_args(settings: SGRPOSettings, batch: GlobalBatch) -> SGRPOArgs:
    return SGRPOArgs(kl_coeff=settings.kl_coeff, **PolicyLossArgs.common(settings, batch))


ALGORITHM = Algorithm(
    "sgrpo",
    "rl",
    "prompts",
    batch_loss,
    make_args,
    per_token_means,
    SGRPOSettings,
    reference="kl",
    advantages="group",
    episodes=True,
)
