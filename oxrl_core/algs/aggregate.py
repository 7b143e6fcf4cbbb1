"""Turning per-token losses into one number, explicitly (DESIGN.md "Loss aggregation").

The normalisers count the *global* batch (all micro-batches and ranks), so
summing this over micro-batches gives the loss of the whole batch at once.
"""

from typing import Literal

import torch

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def aggregate(
    per_token: torch.Tensor,  # [B, T-1] loss of each predicted token
    mask: torch.Tensor,  # [B, T-1] 1 on response tokens
    mode: LossAgg,
    num_tokens: float,  # response tokens in the global batch
    num_seqs: float,  # sequences in the global batch
    max_len: float,  # the constant of Dr. GRPO's token-sum normalisation
) -> torch.Tensor:
    summed = (per_token * mask).sum(-1)  # [B]
    if mode == "token-mean":  # every token of the batch weighs the same (DAPO, CISPO)
        return summed.sum() / num_tokens
    if mode == "seq-mean-token-mean":  # original GRPO: mean over each sequence, then over sequences
        return (summed / mask.sum(-1).clamp(min=1)).sum() / num_seqs
    if mode == "seq-mean-token-sum-norm":  # Dr. GRPO: no length bias from a per-sequence mean
        return (summed / max_len).sum() / num_seqs
    raise ValueError(f"unknown loss aggregation {mode!r}")
