"""Knowledge distillation (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network", arXiv 1503.02531).

On response tokens, token mean over the global batch:

    loss = alpha * CE(data) + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(student / T))

T^2 keeps the soft term's gradient on the same scale as the hard term's when T changes
(the paper, section 2). The per-token KL comes in computed (`algs/kl.py`: in
float32 or wider, since half-precision logits lose the small probabilities the KL is made of;
one sequence at a time; the teacher, a fixed target, passes no gradient).
"""

from dataclasses import asdict, dataclass
from typing import Annotated

import torch
from pydantic import Field

from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossArgs, LossResult
from oxrl_core.algs.kl import token_kl
from oxrl_core.algs.settings import PositiveFloat, Settings


def kd_loss(
    kl: torch.Tensor,  # [B, T-1] KL(teacher || student) at temperature T, prediction-aligned
    logprobs: torch.Tensor,  # [B, T-1] student log p of the data's next token, temperature 1
    response_mask: torch.Tensor,  # [B, T-1] 1 where the target token is a response token
    *,
    alpha: float,
    temperature: float,
    num_tokens: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    on_response = response_mask > 0  # [B, T-1]
    # torch.where rather than a product: masked positions get exactly zero gradient, whatever they hold
    kl_sum = torch.where(on_response, kl, 0.0).sum()
    nll_sum = -torch.where(on_response, logprobs.to(kl.dtype), 0.0).sum()
    loss = (alpha * nll_sum + (1 - alpha) * temperature**2 * kl_sum) / num_tokens
    return loss, {"nll_sum": nll_sum.detach(), "kl_sum": kl_sum.detach(), "tokens": on_response.sum().float()}


@dataclass(frozen=True)
class KDArgs(LossArgs):
    alpha: float
    temperature: float
    num_tokens: float  # response tokens in the global batch


def batch_loss(outputs: Batch, batch: Batch, args: KDArgs) -> LossResult:
    kl = token_kl(outputs["logits"], outputs["teacher_logits"], args.temperature)  # [B, T-1], row by row
    return kd_loss(kl, outputs["logprobs"], batch["response_mask"], **asdict(args))


def kd_means(sums: dict[str, float]) -> dict[str, float]:
    """The data's NLL and the KL to the teacher, each per response token."""
    tokens = max(sums["tokens"], 1.0)
    return {"nll": sums["nll_sum"] / tokens, "kl": sums["kl_sum"] / tokens}


class KDSettings(Settings):
    teacher: str | None = Field(
        None, description="The teacher model (local folder or Hub id); its tokenizer must be the student's."
    )
    alpha: Annotated[float, Field(ge=0, le=1)] = Field(
        0.5, description="Weight of the data's cross-entropy; the teacher's KL gets 1 - alpha."
    )
    temperature: PositiveFloat = Field(
        2.0, description="Softmax temperature of both teacher and student in the KL term."
    )


def make_args(settings: KDSettings, batch: GlobalBatch) -> KDArgs:
    return KDArgs(alpha=settings.alpha, temperature=settings.temperature, num_tokens=batch.tokens())


ALGORITHM = Algorithm("kd", "sl", "conversations", batch_loss, make_args, kd_means, KDSettings, teacher=True)
