"""Per-token log-probabilities and entropies, prediction-aligned (DESIGN.md).

No [B, T, V] float32 tensor ever exists: with a 150k vocabulary that tensor alone is
3 GB for 8 x 640 tokens. On CUDA two Triton kernels stream each row of the logits
(`triton_logprobs.py`); elsewhere the same arithmetic runs one sequence at a time in
float32. Both keep each position's logsumexp, so the logprobs' backward is written out
(onehot minus softmax, straight into one gradient tensor of the logits' dtype) rather
than recomputed by autograd.
"""

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits [B, T, V], input_ids [B, T] -> [B, T-1] with out[b, t] = log p(x[b, t+1] | x[b, :t+1]),
    p the softmax of logits / temperature (the distribution vLLM sampled from)."""
    return _TokenLogprobs.apply(logits, input_ids, temperature, False)[0]


def token_logprobs_and_entropy_metric(logits: torch.Tensor, input_ids: torch.Tensor,
                                      temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` and, from the same softmax, `token_entropy` as a metric (no gradient): both [B, T-1].
    Saves the entropy's own full-vocabulary pass when only the logprobs need a gradient."""
    return _TokenLogprobs.apply(logits, input_ids, temperature, True)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits [B, T, V] -> [B, T-1]: entropy of the next-token distribution at each predicting position."""
    rows = []
    for row in logits.unbind():  # unbind: the backward stacks the rows' gradients once
        log_p = torch.log_softmax(_predicting(row, temperature), dim=-1, dtype=torch.float32)  # [T-1, V]
        rows.append(-(log_p.exp() * log_p).sum(-1))
    return torch.stack(rows)


def _predicting(row: torch.Tensor, temperature: float) -> torch.Tensor:
    """row [T, V] -> [T-1, V]: the logits / temperature of the positions that predict a next token."""
    return row[:-1] if temperature == 1.0 else row[:-1].float() / temperature


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, input_ids, temperature, with_entropy):  # [B, T, V], [B, T], float, bool
        targets = input_ids[:, 1:]  # [B, T-1]
        if logits.is_cuda:
            from oxrl_core.training.triton_logprobs import logprobs_forward

            logits = logits.contiguous()
            picked, lse, entropy = logprobs_forward(logits, targets, temperature, with_entropy)
        else:
            picked, lse, entropy = _rows_forward(logits, targets, temperature, with_entropy)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(entropy)
        return picked, entropy

    @staticmethod
    def backward(ctx, grad, _):  # grad [B, T-1]; the entropy metric has none
        logits, targets, lse = ctx.saved_tensors
        if logits.is_cuda:
            from oxrl_core.training.triton_logprobs import logprobs_backward

            return logprobs_backward(logits, targets, lse, grad, ctx.temperature), None, None, None
        return _rows_backward(logits, targets, lse, grad, ctx.temperature), None, None, None


def _rows_forward(logits, targets, temperature, with_entropy):
    """logits [B, T, V], targets [B, T-1] -> logprobs, logsumexps, entropies (or empty), float32 [B, T-1]."""
    picked = torch.empty(targets.shape, dtype=torch.float32, device=logits.device)  # [B, T-1]
    lse = torch.empty_like(picked)
    entropy = torch.empty_like(picked) if with_entropy else picked.new_empty(0)
    for b, row in enumerate(logits):
        x = _predicting(row, temperature).float()  # [T-1, V]
        lse[b] = torch.logsumexp(x, dim=-1)
        picked[b] = x.gather(-1, targets[b, :, None]).squeeze(-1) - lse[b]
        if with_entropy:
            entropy[b] = lse[b] - (torch.softmax(x, dim=-1) * x).sum(-1)  # H = lse - E_p[x]
    return picked, lse, entropy


def _rows_backward(logits, targets, lse, grad, temperature):
    """d(x_target/T - lse)/dx = (onehot(target) - softmax(x/T)) / T at each predicting position; 0 at the last."""
    grad = grad / temperature  # [B, T-1]
    grad_logits = torch.empty_like(logits)  # [B, T, V]
    grad_logits[:, -1] = 0
    for b, row in enumerate(logits):
        row_grad = torch.exp(_predicting(row, temperature).float() - lse[b, :, None])  # softmax [T-1, V]
        row_grad.mul_(-grad[b, :, None]).scatter_add_(-1, targets[b, :, None], grad[b, :, None])
        grad_logits[b, :-1] = row_grad
    return grad_logits


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
