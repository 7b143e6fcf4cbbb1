"""Knowledge distillation (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network", arXiv 1503.02531).

On response tokens, token mean over the global batch:

    loss = alpha * CE(data) + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(student / T))

T^2 keeps the soft term's gradient on the same scale as the hard term's when T changes
(the paper, section 2). The softmaxes run in float32 or wider: half-precision logits lose the
small probabilities the KL is made of. The teacher is a fixed target and passes no gradient.
"""

import torch
import torch.nn.functional as F


def kd_loss(
    student_logits: torch.Tensor,  # [B, T-1, V] prediction-aligned
    teacher_logits: torch.Tensor,  # [B, T-1, V] same positions, same vocabulary
    logprobs: torch.Tensor,  # [B, T-1] student log p of the data's next token, temperature 1
    response_mask: torch.Tensor,  # [B, T-1] 1 where the target token is a response token
    *, alpha: float, temperature: float, num_tokens: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    on_response = response_mask > 0  # [B, T-1]
    student_logp = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)  # [B, T-1, V]
    teacher_logp = F.log_softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)  # [B, T-1, V]
    kl = (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1)  # [B, T-1]
    # torch.where rather than a product: masked positions get exactly zero gradient, whatever they hold
    kl_sum = torch.where(on_response, kl, 0.0).sum()
    nll_sum = -torch.where(on_response, logprobs.to(dtype), 0.0).sum()
    loss = (alpha * nll_sum + (1 - alpha) * temperature**2 * kl_sum) / num_tokens
    return loss, {"nll_sum": nll_sum.item(), "kl_sum": kl_sum.item(), "tokens": float(on_response.sum())}
