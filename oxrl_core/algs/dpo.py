"""DPO: Direct Preference Optimization (Rafailov et al. 2023, arXiv 2305.18290).

With sequence logprob SUMS and h = (lp_c - ref_c) - (lp_r - ref_r), per pair

    -(1 - ls) * log sigmoid(beta h) - ls * log sigmoid(-beta h)

ls is the label smoothing of conservative DPO (cDPO, Mitchell 2023): each label is taken to be
flipped with probability ls, so the loss stops rewarding ever larger margins. ls = 0 is the
paper's loss. The implicit reward of a response is beta * (lp - ref).
"""

from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from pydantic import Field

from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossResult, PairArgs, reference_pair_loss
from oxrl_core.algs.pairs import pair_means, pair_metrics
from oxrl_core.algs.settings import PreferenceBeta, ReferenceChoice


def dpo_loss(
    chosen_logps: torch.Tensor,  # [N] sum of the chosen response's token logprobs under the policy
    rejected_logps: torch.Tensor,  # [N]
    ref_chosen_logps: torch.Tensor,  # [N] the same sums under the frozen reference
    ref_rejected_logps: torch.Tensor,  # [N]
    chosen_lengths: torch.Tensor,  # [N] response tokens; 0 on padding filler
    rejected_lengths: torch.Tensor,  # [N]
    *,
    beta: float,
    label_smoothing: float,
    num_pairs: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    valid = (chosen_lengths > 0) & (rejected_lengths > 0)  # [N] a pair counts only if both responses have tokens
    # torch.where rather than a product: filler rows get exactly zero gradient, whatever values they hold
    reward_chosen = torch.where(valid, beta * (chosen_logps - ref_chosen_logps), 0.0)  # [N]
    reward_rejected = torch.where(valid, beta * (rejected_logps - ref_rejected_logps), 0.0)  # [N]
    margin = reward_chosen - reward_rejected  # [N] beta * h
    per_pair = -(1 - label_smoothing) * F.logsigmoid(margin) - label_smoothing * F.logsigmoid(-margin)  # [N]
    loss = torch.where(valid, per_pair, 0.0).sum() / num_pairs
    return loss, pair_metrics(reward_chosen, reward_rejected, valid)


@dataclass(frozen=True)
class DPOArgs(PairArgs):
    beta: float
    label_smoothing: float


def batch_loss(outputs: Batch, batch: Batch, args: DPOArgs) -> LossResult:
    return reference_pair_loss(dpo_loss, outputs, batch, args)


class DPOLossSettings(PreferenceBeta):
    """What DPO's loss takes: Online DPO's settings; DPO's and SPIN's add theirs."""

    label_smoothing: Annotated[float, Field(ge=0, lt=0.5)] = Field(
        0.0, description="Assumed share of flipped preference labels (conservative DPO)."
    )


class DPOSettings(ReferenceChoice, DPOLossSettings):
    pass


def make_args(settings: DPOLossSettings, batch: GlobalBatch) -> DPOArgs:
    return DPOArgs(beta=settings.beta, label_smoothing=settings.label_smoothing, num_pairs=batch.pairs())


ALGORITHM = Algorithm("dpo", "sl", "pairs", batch_loss, make_args, pair_means, DPOSettings, reference="configurable")
