"""KL between the policy and another model: k3 at the sampled tokens (the KL terms of GRPO and SGRPO), and the
per-token KL between two full next-token distributions (knowledge distillation's soft term)."""

import torch


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """[B, T-1] -> [B, T-1]: Schulman's k3 estimate of KL(policy || reference) at each sampled token,
    exp(ref - logp) - (ref - logp) - 1: unbiased and never negative."""
    log_ratio_ref = ref_logprobs - logprobs
    return torch.exp(log_ratio_ref) - log_ratio_ref - 1


def token_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """student_logits, teacher_logits [B, N, V] -> [B, N]: KL(softmax(teacher / T) || softmax(student / T)) at each
    position, in float32 or wider. One sequence at a time, so no [B, N, V] float32 tensor exists (KD over a 150k
    vocabulary); the teacher is a fixed target and gets no gradient."""
    return _TokenKL.apply(student_logits, teacher_logits.detach(), temperature)


class _TokenKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, student, teacher, temperature):  # [B, N, V], [B, N, V], float
        dtype = torch.promote_types(student.dtype, torch.float32)
        kl = torch.empty(student.shape[:2], dtype=dtype, device=student.device)  # [B, N]
        student_lse, teacher_lse = torch.empty_like(kl), torch.empty_like(kl)
        for b in range(len(student)):
            s, t = student[b].to(dtype) / temperature, teacher[b].to(dtype) / temperature  # [N, V]
            student_lse[b], teacher_lse[b] = torch.logsumexp(s, dim=-1), torch.logsumexp(t, dim=-1)
            teacher_logp = t - teacher_lse[b, :, None]
            kl[b] = (teacher_logp.exp() * (teacher_logp - s + student_lse[b, :, None])).sum(-1)
        ctx.save_for_backward(student, teacher, student_lse, teacher_lse)
        ctx.temperature = temperature
        return kl

    @staticmethod
    def backward(ctx, grad):  # grad [B, N]
        student, teacher, student_lse, teacher_lse = ctx.saved_tensors
        temperature, dtype = ctx.temperature, student_lse.dtype
        grad_student = torch.empty_like(student)
        for b in range(len(student)):
            # dKL/dstudent = (softmax(student / T) - softmax(teacher / T)) / T
            p_student = torch.exp(student[b].to(dtype) / temperature - student_lse[b, :, None])  # [N, V]
            p_teacher = torch.exp(teacher[b].to(dtype) / temperature - teacher_lse[b, :, None])
            grad_student[b] = (p_student - p_teacher) * (grad[b, :, None] / temperature)
        return grad_student, None, None
