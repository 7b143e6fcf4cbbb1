"""ORPO: Monolithic Preference Optimization without a reference model (Hong et al. 2024, arXiv 2403.07691).

    loss = NLL(chosen) + lam * mean over pairs of -log sigmoid(log odds(c) - log odds(r))

NLL is the token mean over the global batch's chosen tokens. odds(y) = P / (1 - P) with
P = exp(m), m the response's mean token logprob, so log odds = m - log(1 - exp(m)), computed as
m - log(-expm1(m)) to stay exact for m near 0. The rewards reported are lam * m, as TRL reports them.
"""

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from pydantic import Field

from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossResult, PairArgs, pair_sums
from oxrl_core.algs.pairs import pair_means, pair_metrics
from oxrl_core.algs.settings import PositiveFloat, Settings


def orpo_loss(
    chosen_logps: torch.Tensor,  # [N] sum of the chosen response's token logprobs
    rejected_logps: torch.Tensor,  # [N]
    chosen_lengths: torch.Tensor,  # [N] response tokens; 0 on padding filler
    rejected_lengths: torch.Tensor,  # [N]
    *,
    lam: float,
    num_pairs: float,
    num_chosen_tokens: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    valid = (chosen_lengths > 0) & (rejected_lengths > 0)  # [N] a pair counts only if both responses have tokens
    # filler rows take m = -1, an arbitrary finite stand-in; torch.where gives them exactly zero gradient
    mean_chosen = torch.where(valid, chosen_logps / chosen_lengths.clamp(min=1), -1.0)  # [N]
    mean_rejected = torch.where(valid, rejected_logps / rejected_lengths.clamp(min=1), -1.0)  # [N]
    # log(1 - P) is -inf at m = 0 (a response the model is certain of, in rounding): keep m just below 0
    below_zero = -torch.finfo(mean_chosen.dtype).tiny
    log_odds_chosen = mean_chosen - torch.log(-torch.expm1(mean_chosen.clamp(max=below_zero)))  # [N]
    log_odds_rejected = mean_rejected - torch.log(-torch.expm1(mean_rejected.clamp(max=below_zero)))  # [N]
    log_odds_ratio = torch.where(valid, log_odds_chosen - log_odds_rejected, 0.0)  # [N]
    odds_ratio_loss = torch.where(valid, -F.logsigmoid(log_odds_ratio), 0.0).sum() / num_pairs
    nll_sum = -torch.where(valid, chosen_logps, 0.0).sum()
    loss = nll_sum / num_chosen_tokens + lam * odds_ratio_loss
    reward_chosen = torch.where(valid, lam * mean_chosen, 0.0)  # [N]
    reward_rejected = torch.where(valid, lam * mean_rejected, 0.0)  # [N]
    return loss, pair_metrics(reward_chosen, reward_rejected, valid) | {
        "nll_sum": nll_sum.detach(),
        "log_odds_ratio_sum": log_odds_ratio.sum().detach(),
    }


@dataclass(frozen=True)
class ORPOArgs(PairArgs):
    lam: float
    num_chosen_tokens: float  # the chosen responses' tokens of those pairs


def batch_loss(outputs: Batch, batch: Batch, args: ORPOArgs) -> LossResult:
    return orpo_loss(*pair_sums(outputs, batch), **asdict(args))


def orpo_means(sums: dict[str, float]) -> dict[str, float]:
    """The pairs' means, and the mean log odds(chosen) - log odds(rejected) (TRL's log_odds_chosen)."""
    return pair_means(sums) | {"log_odds_chosen": sums["log_odds_ratio_sum"] / max(sums["pairs"], 1.0)}


class ORPOSettings(Settings):
    lam: PositiveFloat = Field(0.1, description="Weight of the odds-ratio term against the chosen NLL.")


def make_args(settings: ORPOSettings, batch: GlobalBatch) -> ORPOArgs:
    chosen_tokens = sum(float(c[(c > 0) & (r > 0)].sum()) for c, r in batch.pair_halves())
    return ORPOArgs(lam=settings.lam, num_pairs=batch.pairs(), num_chosen_tokens=chosen_tokens)


ALGORITHM = Algorithm("orpo", "sl", "pairs", batch_loss, make_args, orpo_means, ORPOSettings)
