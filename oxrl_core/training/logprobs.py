"""Per-token log-probabilities and entropies, prediction-aligned (docs/design/architecture.md, conventions).

No [B, T, V] float32 tensor ever exists: with a 150k vocabulary that tensor alone is
3 GB for 8 x 640 tokens. On CUDA two Triton kernels stream each row of the logits
(`triton_logprobs.py`); elsewhere the same arithmetic runs one sequence at a time in
float32 (or wider). Both keep each position's logsumexp (and entropy), so the backward
is written out (onehot minus softmax, and the entropy's own term, straight into one
gradient tensor of the logits' dtype) rather than recomputed by autograd.

The training engine mostly never makes the logits: its fused head (`fused_head.py`)
runs the same row functions, `rows_forward` and `rows_backward`, on chunks of them.
`token_logprobs` serves where the logits exist anyway: KD, whose loss needs them (its KL: `algs/kl.py`), and
output layers the fused head does not take (a LoRA adapter on lm_head).
"""

import os

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits [B, T, V], input_ids [B, T] -> [B, T-1] with out[b, t] = log p(x[b, t+1] | x[b, :t+1]),
    p the softmax of logits / temperature (the distribution vLLM sampled from)."""
    return _TokenLogprobs.apply(logits, input_ids, temperature, False)[0]


def token_logprobs_and_entropy(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` and, from the same softmax, the entropy of the next-token distribution at each predicting
    position: both [B, T-1], both with their gradients (PPO's entropy bonus; detach it for a metric)."""
    return _TokenLogprobs.apply(logits, input_ids, temperature, True)


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, input_ids, temperature, with_entropy):  # [B, T, V], [B, T], float, bool
        logits, targets = logits.contiguous(), input_ids[:, 1:]  # [B, T-1]
        picked, lse, entropy = rows_forward(logits[:, :-1], targets, temperature, with_entropy)
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an entropy reported as a metric has no gradient: None, not zeros
        return picked, entropy

    @staticmethod
    def backward(ctx, grad, grad_entropy):  # [B, T-1] each, or None
        logits, targets, lse, entropy = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)  # [B, T, V]
        grad_logits[:, -1] = 0  # the last position predicts nothing
        rows_backward(logits[:, :-1], targets, lse, grad, ctx.temperature, entropy, grad_entropy, grad_logits[:, :-1])
        return grad_logits, None, None, None


def _on_triton(x: torch.Tensor) -> bool:
    """The Triton kernels run on CUDA, and on CPU under Triton's interpreter (TRITON_INTERPRET=1, as in the tests)."""
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def rows_forward(
    x: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Predicting rows x [B, P, V] (logits; each row contiguous), targets [B, P] -> logprobs, logsumexps and entropies
    (or an empty tensor) of softmax(x / temperature), each [B, P] in float32 (float64 for float64 rows, off CUDA)."""
    if _on_triton(x):
        from oxrl_core.training.triton_logprobs import logprobs_forward

        return logprobs_forward(x, targets, temperature, with_entropy)
    picked = torch.empty(targets.shape, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)  # [B, P]
    lse = torch.empty_like(picked)
    entropy = torch.empty_like(picked) if with_entropy else picked.new_empty(0)
    for b, row in enumerate(x):  # one sequence (or chunk) at a time: [P, V] in float32 at most
        row = _scaled(row, temperature)
        lse[b] = torch.logsumexp(row, dim=-1)
        picked[b] = row.gather(-1, targets[b, :, None]).squeeze(-1) - lse[b]
        if with_entropy:
            entropy[b] = lse[b] - (torch.softmax(row, dim=-1) * row).sum(-1)  # H = lse - E_p[x]
    return picked, lse, entropy


def rows_backward(
    x: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    grad: torch.Tensor | None,
    temperature: float,
    entropy: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """Write the gradient of the rows x [B, P, V] into `out` (x's shape, strides and dtype; may be x itself) from the
    logprobs' gradient `grad` and the entropies' `grad_entropy` ([B, P] each, None where there is none), with
    `rows_forward`'s logsumexps and entropies: d(x_target/T - lse)/dx = (onehot - p) / T, dH/dx = -p (log p + H) / T.
    A target outside [0, V) adds no onehot term: the fused head's backward passes slices of the vocabulary."""
    grad = torch.zeros_like(lse) if grad is None else grad
    if _on_triton(x):
        from oxrl_core.training.triton_logprobs import logprobs_backward

        logprobs_backward(x, targets, lse, grad, temperature, entropy, grad_entropy, out)
        return
    for b, row in enumerate(x):
        log_p = _scaled(row, temperature) - lse[b, :, None]  # [P, V]
        scale = grad[b, :, None] / temperature  # [P, 1]
        if grad_entropy is not None:
            scale = scale + grad_entropy[b, :, None] / temperature * (log_p + entropy[b, :, None])  # [P, V]
        row_grad = log_p.exp_().mul_(scale).neg_()  # -p (grad + grad_entropy (log p + H)) / T
        hit = ((targets[b] >= 0) & (targets[b] < row.shape[-1])).nonzero().squeeze(-1)  # rows whose target is here
        row_grad[hit, targets[b, hit]] += grad[b, hit] / temperature
        out[b] = row_grad


def _scaled(row: torch.Tensor, temperature: float) -> torch.Tensor:
    """row [P, V] -> row / temperature in float32 (float64 stays float64)."""
    row = row.to(torch.promote_types(row.dtype, torch.float32))
    return row if temperature == 1.0 else row / temperature
