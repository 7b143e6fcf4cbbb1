"""SimPO: Simple Preference Optimization with a reference-free reward (Meng et al. 2024, arXiv 2405.14734).

The reward is the length-normalised logprob beta * lp / |y| (no reference model); per pair

    -log sigmoid(beta lp_c / |c| - beta lp_r / |r| - gamma)

gamma is the target reward margin in reward units, as in the paper's equation (TRL's
`gamma_beta_ratio` is gamma / beta).
"""

from dataclasses import asdict, dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from pydantic import Field

from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossResult, PairArgs, pair_sums
from oxrl_core.algs.pairs import pair_means, pair_metrics
from oxrl_core.algs.settings import PositiveFloat, Settings


def simpo_loss(
    chosen_logps: torch.Tensor,  # [N] sum of the chosen response's token logprobs
    rejected_logps: torch.Tensor,  # [N]
    chosen_lengths: torch.Tensor,  # [N] response tokens; 0 on padding filler
    rejected_lengths: torch.Tensor,  # [N]
    *,
    beta: float,
    gamma: float,
    num_pairs: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    valid = (chosen_lengths > 0) & (rejected_lengths > 0)  # [N] a pair counts only if both responses have tokens
    # clamp: filler rows divide by 1, not 0; torch.where then gives them exactly zero gradient
    reward_chosen = torch.where(valid, beta * chosen_logps / chosen_lengths.clamp(min=1), 0.0)  # [N]
    reward_rejected = torch.where(valid, beta * rejected_logps / rejected_lengths.clamp(min=1), 0.0)  # [N]
    margin = reward_chosen - reward_rejected  # [N]
    per_pair = -F.logsigmoid(margin - gamma)  # [N]
    loss = torch.where(valid, per_pair, 0.0).sum() / num_pairs
    return loss, pair_metrics(reward_chosen, reward_rejected, valid)


@dataclass(frozen=True)
class SimPOArgs(PairArgs):
    beta: float
    gamma: float


def batch_loss(outputs: Batch, batch: Batch, args: SimPOArgs) -> LossResult:
    return simpo_loss(*pair_sums(outputs, batch), **asdict(args))


class SimPOSettings(Settings):
    beta: PositiveFloat = Field(0.1, description="Reward scale (the paper uses 2-10).")
    gamma: Annotated[float, Field(ge=0)] = Field(0.5, description="Target reward margin, in reward units.")


def make_args(settings: SimPOSettings, batch: GlobalBatch) -> SimPOArgs:
    return SimPOArgs(beta=settings.beta, gamma=settings.gamma, num_pairs=batch.pairs())


ALGORITHM = Algorithm("simpo", "sl", "pairs", batch_loss, make_args, pair_means, SimPOSettings)
