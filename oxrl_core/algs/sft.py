"""Supervised fine-tuning: next-token negative log-likelihood on response tokens only.

The mean is over every response token of the *global* batch (all micro-batches
and ranks), so a long answer weighs by its length, as in a single big batch.
"""

import torch


def sft_loss(
    logprobs: torch.Tensor,  # [B, T-1] log p(x[t+1] | x[:t+1])
    response_mask: torch.Tensor,  # [B, T-1] 1 where the target token is a response token
    num_tokens: float,  # response tokens in the global batch
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    nll_sum = -(logprobs * response_mask).sum()
    loss = nll_sum / num_tokens
    return loss, {"nll_sum": nll_sum.detach(), "tokens": response_mask.sum().float()}
