"""IPO: Identity Preference Optimization (Azar et al. 2023, "A General Theoretical Paradigm to
Understand Learning from Human Preferences", arXiv 2310.12036).

With sequence logprob SUMS and h = (lp_c - ref_c) - (lp_r - ref_r), per pair

    (h - 1 / (2 beta))^2

a regression of the log-ratio margin onto a fixed target, so unlike DPO the margin cannot grow
without bound. This follows the paper's formula; TRL instead length-normalises the logprobs
(mean token logprob) for IPO. Rewards for the metrics are beta * (lp - ref), as in DPO.
"""

from dataclasses import dataclass

import torch

from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossResult, PairArgs, reference_pair_loss
from oxrl_core.algs.pairs import pair_means, pair_metrics
from oxrl_core.algs.settings import PreferenceBeta, ReferenceChoice


def ipo_loss(
    chosen_logps: torch.Tensor,  # [N] sum of the chosen response's token logprobs under the policy
    rejected_logps: torch.Tensor,  # [N]
    ref_chosen_logps: torch.Tensor,  # [N] the same sums under the frozen reference
    ref_rejected_logps: torch.Tensor,  # [N]
    chosen_lengths: torch.Tensor,  # [N] response tokens; 0 on padding filler
    rejected_lengths: torch.Tensor,  # [N]
    *,
    beta: float,
    num_pairs: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    valid = (chosen_lengths > 0) & (rejected_lengths > 0)  # [N] a pair counts only if both responses have tokens
    # torch.where rather than a product: filler rows get exactly zero gradient, whatever values they hold
    log_ratio_chosen = torch.where(valid, chosen_logps - ref_chosen_logps, 0.0)  # [N]
    log_ratio_rejected = torch.where(valid, rejected_logps - ref_rejected_logps, 0.0)  # [N]
    h = log_ratio_chosen - log_ratio_rejected  # [N]
    per_pair = (h - 1 / (2 * beta)) ** 2  # [N]
    loss = torch.where(valid, per_pair, 0.0).sum() / num_pairs
    reward_chosen, reward_rejected = beta * log_ratio_chosen, beta * log_ratio_rejected  # [N] each
    return loss, pair_metrics(reward_chosen, reward_rejected, valid)


@dataclass(frozen=True)
class IPOArgs(PairArgs):
    beta: float


def batch_loss(outputs: Batch, batch: Batch, args: IPOArgs) -> LossResult:
    return reference_pair_loss(ipo_loss, outputs, batch, args)


class IPOSettings(ReferenceChoice, PreferenceBeta):
    """IPO's target margin is 1 / (2 beta)."""


def make_args(settings: IPOSettings, batch: GlobalBatch) -> IPOArgs:
    return IPOArgs(beta=settings.beta, num_pairs=batch.pairs())


ALGORITHM = Algorithm("ipo", "sl", "pairs", batch_loss, make_args, pair_means, IPOSettings, reference="configurable")
