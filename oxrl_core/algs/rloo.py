"""RLOO, REINFORCE leave-one-out (Ahmadian et al. 2024, Back to Basics, arXiv 2402.14740), in TRL's form.

Each sample's advantage is its reward less the mean reward of the other samples of its prompt
(`advantages.leave_one_out`; with kl_coeff > 0 the reward first loses kl_coeff x the sample's summed KL to the
reference). The ratio is the whole sample's, s_i = exp(sum_t (logp_t - old_t)), clipped as in PPO:

    -min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i), averaged over the samples.

At the single update on fresh samples s_i = 1, and the gradient is the paper's, -A_i grad log pi(y_i). A sampler-trainer
correction weighs the sample as a whole, so it must be sequence-level.
"""

from dataclasses import asdict, dataclass
from typing import Annotated, Literal

import torch
from pydantic import Field

from oxrl_core.algs.aggregate import clipped_surrogate, per_token_means
from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossArgs, LossResult
from oxrl_core.algs.settings import Clip, Correction, KLPenalty
from oxrl_core.errors import OxrlError


def rloo_loss(
    logprobs: torch.Tensor,  # [B, T-1] current policy, prediction-aligned
    old_logprobs: torch.Tensor,  # [B, T-1] policy that sampled the tokens
    advantages: torch.Tensor,  # [B] one per sequence
    mask: torch.Tensor,  # [B, T-1] response tokens
    is_weights: torch.Tensor,  # [B, T-1] sequence-level correction (each row one value), 1 when off
    *,
    clip_low: float,
    clip_high: float,
    num_seqs: float,
) -> LossResult:
    ratio = torch.exp(((logprobs - old_logprobs) * mask).sum(-1))  # [B] the sample's ratio
    per_sample, clipped = clipped_surrogate(ratio, advantages, clip_low, clip_high)  # [B] each
    return (per_sample * is_weights[:, 0]).sum() / num_seqs, {"clip_frac_sum": (clipped[:, None] * mask).sum()}


@dataclass(frozen=True)
class RLOOArgs(LossArgs):
    clip_low: float
    clip_high: float
    num_seqs: float  # samples in the global batch


def batch_loss(outputs: Batch, batch: Batch, args: RLOOArgs) -> LossResult:
    return rloo_loss(
        outputs["logprobs"],
        batch["old_logprobs"],
        batch["advantages"],
        batch["response_mask"],
        batch["is_weights"],
        **asdict(args),
    )


class RLOOSettings(Correction, KLPenalty, Clip):
    """The KL to the reference comes off each sample's reward; the correction weighs the sample as a whole."""

    fixed = {"loss_agg": "RLOO's loss is a mean over samples by definition"}
    clip_high: Annotated[float, Field(ge=0)] = Field(
        0.2, description="Upper clip of the sample's ratio: 1 + clip_high."
    )
    sampler_correction: Literal["none", "sequence-truncate", "sequence-mask"] = Field(
        "sequence-truncate",
        description="Correct for vLLM's probabilities differing from the trainer's: the sample's "
        "loss weighted by p_trainer / p_vLLM of the whole sample, truncated at `correction_cap` (sequence-truncate) "
        "or left out outside [correction_floor, correction_cap] (sequence-mask). RLOO's ratio is the sample's, so "
        "is its correction: the token-level ones do not apply.",
    )


def make_args(settings: RLOOSettings, batch: GlobalBatch) -> RLOOArgs:
    return RLOOArgs(clip_low=settings.clip_low, clip_high=settings.clip_high, num_seqs=batch.sequences())


def check(config) -> None:
    if config.rollout.n_samples < 2:
        raise OxrlError(
            f"rollout.n_samples={config.rollout.n_samples}: RLOO's baseline is the other samples of the "
            f"prompt; use 2 or more"
        )


ALGORITHM = Algorithm(
    "rloo",
    "rl",
    "prompts",
    batch_loss,
    make_args,
    per_token_means,
    RLOOSettings,
    reference="kl",
    advantages="leave-one-out",
    episodes=True,
    check=check,
)
