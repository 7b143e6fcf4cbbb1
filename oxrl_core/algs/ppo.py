"""PPO with a value head: clipped surrogate, clipped value loss, entropy bonus.

Schulman et al. 2017 (arXiv 1707.06347); advantages from GAE (`advantages.gae`).
"""

from dataclasses import asdict, dataclass
from typing import Annotated

import torch
from pydantic import Field

from oxrl_core.algs.aggregate import LossAgg, PolicyLossArgs, aggregate, clipped_surrogate, per_token_means
from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossResult
from oxrl_core.algs.settings import Aggregation, Clip, Discount, KLPenalty, PolicyGradient, PositiveFloat, Whitening


def ppo_loss(
    logprobs: torch.Tensor,  # [B, T-1] current policy, prediction-aligned
    old_logprobs: torch.Tensor,  # [B, T-1] policy that sampled the tokens
    advantages: torch.Tensor,  # [B, T-1] per token, from GAE
    mask: torch.Tensor,  # [B, T-1] response tokens
    is_weights: torch.Tensor,  # [B, T-1] sampler-trainer correction (correction.py), 1 when off
    values: torch.Tensor,  # [B, T-1] current critic
    old_values: torch.Tensor,  # [B, T-1] critic when the advantages were computed
    returns: torch.Tensor,  # [B, T-1] GAE returns (A + V_old)
    entropy: torch.Tensor,  # [B, T-1] policy entropy at each position
    *,
    clip_low: float,
    clip_high: float,
    value_clip: float,
    vf_coeff: float,
    entropy_coeff: float,
    loss_agg: LossAgg,
    num_tokens: float,
    num_seqs: float,
    max_tokens: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T-1]
    policy, clipped = clipped_surrogate(ratio, advantages, clip_low, clip_high)  # [B, T-1] each
    clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
    value = 0.5 * torch.maximum((values - returns) ** 2, (clipped_values - returns) ** 2)
    per_token = policy * is_weights + vf_coeff * value - entropy_coeff * entropy
    loss = aggregate(per_token, mask, loss_agg, num_tokens, num_seqs, max_tokens)
    return loss, {
        "clip_frac_sum": (clipped * mask).sum(),
        "value_loss_sum": (value * mask).sum().detach(),
        "entropy_sum": (entropy * mask).sum().detach(),
    }


@dataclass(frozen=True)
class PPOArgs(PolicyLossArgs):
    value_clip: float
    vf_coeff: float
    entropy_coeff: float

    @property
    def entropy_grad(self) -> bool:
        return self.entropy_coeff > 0


def batch_loss(outputs: Batch, batch: Batch, args: PPOArgs) -> LossResult:
    return ppo_loss(
        outputs["logprobs"],
        batch["old_logprobs"],
        batch["advantages"],
        batch["response_mask"],
        batch["is_weights"],
        outputs["values"].float(),
        batch["old_values"],
        batch["returns"],
        outputs["entropy"],
        **asdict(args),
    )


class PPOSettings(PolicyGradient, Discount, Whitening, Aggregation, KLPenalty, Clip):
    """The KL to the reference is a per-token penalty in the reward (InstructGPT's shaping)."""

    lam: Annotated[float, Field(ge=0, le=1)] = Field(0.95, description="GAE lambda (bias-variance trade-off).")
    vf_coeff: Annotated[float, Field(ge=0)] = Field(0.1, description="Weight of the value loss.")
    value_clip: PositiveFloat = Field(
        0.2, description="New values stay within this distance of the old ones in the clipped value loss."
    )
    entropy_coeff: Annotated[float, Field(ge=0)] = Field(0.0, description="Weight of the entropy bonus.")


def make_args(settings: PPOSettings, batch: GlobalBatch) -> PPOArgs:
    return PPOArgs(
        value_clip=settings.value_clip,
        vf_coeff=settings.vf_coeff,
        entropy_coeff=settings.entropy_coeff,
        **PolicyLossArgs.common(settings, batch),
    )


# Episodes: PPO's per-token advantages across environment turns are not built.
ALGORITHM = Algorithm(
    "ppo",
    "rl",
    "prompts",
    batch_loss,
    make_args,
    per_token_means,
    PPOSettings,
    reference="kl",
    critic=True,
    advantages="gae",
)
