"""Supervised fine-tuning: next-token negative log-likelihood on response tokens only.

The mean is over every response token of the *global* batch (all micro-batches
and ranks), so a long answer weighs by its length, as in a single big batch.
"""

from dataclasses import asdict, dataclass

import torch

from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossArgs, LossResult


def sft_loss(
    logprobs: torch.Tensor,  # [B, T-1] log p(x[t+1] | x[:t+1])
    response_mask: torch.Tensor,  # [B, T-1] 1 where the target token is a response token
    num_tokens: float,  # response tokens in the global batch
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    nll_sum = -(logprobs * response_mask).sum()
    loss = nll_sum / num_tokens
    return loss, {"nll_sum": nll_sum.detach(), "tokens": response_mask.sum().float()}


@dataclass(frozen=True)
class SFTArgs(LossArgs):
    num_tokens: float  # response tokens in the global batch


def batch_loss(outputs: Batch, batch: Batch, args: SFTArgs) -> LossResult:
    return sft_loss(outputs["logprobs"], batch["response_mask"], **asdict(args))


def nll_means(sums: dict[str, float]) -> dict[str, float]:
    """The mean negative log-likelihood per response token (held out: the eval loss, `eval_nll`)."""
    return {"nll": sums["nll_sum"] / max(sums["tokens"], 1.0)}


def make_args(settings, batch: GlobalBatch) -> SFTArgs:
    return SFTArgs(num_tokens=batch.tokens())


ALGORITHM = Algorithm("sft", "sl", "conversations", batch_loss, make_args, nll_means)
