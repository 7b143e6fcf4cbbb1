"""Reward model: Bradley-Terry pairwise loss on a scalar head (InstructGPT, Ouyang et al. 2022, arXiv 2203.02155).

Per pair -log sigmoid(s_c - s_r - margin). The margin is per pair, larger where annotators
preferred the chosen response more clearly (Llama 2, Touvron et al. 2023, arXiv 2307.09288);
margin 0 is InstructGPT's loss. The scores are the rewards reported.
"""

from dataclasses import asdict

import torch
import torch.nn.functional as F

from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossResult, PairArgs
from oxrl_core.algs.pairs import pair_means, pair_metrics


def rm_loss(
    chosen_scores: torch.Tensor,  # [N] scalar head on the chosen response's last token
    rejected_scores: torch.Tensor,  # [N]
    margin: torch.Tensor,  # [N] required score gap; 0 for plain Bradley-Terry
    chosen_lengths: torch.Tensor,  # [N] response tokens; 0 on padding filler
    rejected_lengths: torch.Tensor,  # [N]
    *,
    num_pairs: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    valid = (chosen_lengths > 0) & (rejected_lengths > 0)  # [N] a pair counts only if both responses have tokens
    # torch.where rather than a product: filler rows get exactly zero gradient, whatever values they hold
    reward_chosen = torch.where(valid, chosen_scores, 0.0)  # [N]
    reward_rejected = torch.where(valid, rejected_scores, 0.0)  # [N]
    per_pair = -F.logsigmoid(reward_chosen - reward_rejected - torch.where(valid, margin, 0.0))  # [N]
    loss = torch.where(valid, per_pair, 0.0).sum() / num_pairs
    return loss, pair_metrics(reward_chosen, reward_rejected, valid)


def batch_loss(outputs: Batch, batch: Batch, args: PairArgs) -> LossResult:
    chosen_len, rejected_len = batch["response_mask"].sum(-1).chunk(2)
    return rm_loss(*outputs["scores"].float().chunk(2), batch["margin"], chosen_len, rejected_len, **asdict(args))


def make_args(settings, batch: GlobalBatch) -> PairArgs:
    return PairArgs(num_pairs=batch.pairs())


ALGORITHM = Algorithm("rm", "sl", "pairs", batch_loss, make_args, pair_means, scalar_head=True)
