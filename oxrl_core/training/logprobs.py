"""Per-token log-probabilities and entropies, prediction-aligned (DESIGN.md).

Both work one sequence at a time in float32, so no [B, T, V] float32 tensor ever
exists: with a 150k vocabulary that tensor alone is 3 GB for 8 x 640 tokens.
Softmaxes take `dtype=float32`, so the cast happens inside one fused kernel instead of
a separate float32 copy of the row. The logprobs' backward is written out (softmax
minus one-hot, straight into one gradient tensor of the logits' dtype) rather than
recomputed by autograd.
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
        targets = input_ids[:, 1:, None]  # [B, T-1, 1]
        picked = torch.empty(targets.shape[:2], dtype=torch.float32, device=logits.device)  # [B, T-1]
        entropy = torch.empty_like(picked) if with_entropy else picked.new_empty(0)  # [B, T-1] or unused
        for b, row in enumerate(logits):
            log_p = torch.log_softmax(_predicting(row, temperature), dim=-1, dtype=torch.float32)  # [T-1, V]
            picked[b] = log_p.gather(-1, targets[b]).squeeze(-1)
            if with_entropy:
                entropy[b] = -(log_p.exp() * log_p).sum(-1)
        ctx.save_for_backward(logits, targets)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(entropy)
        return picked, entropy

    @staticmethod
    def backward(ctx, grad, _):  # grad [B, T-1]; the entropy metric has none
        logits, targets = ctx.saved_tensors
        # d(x_target/T - lse)/dx = (onehot(target) - softmax(x/T)) / T at each predicting position; 0 at the last
        grad = grad / ctx.temperature
        grad_logits = torch.empty_like(logits)
        grad_logits[:, -1] = 0
        for b, row in enumerate(logits):
            row_grad = torch.softmax(_predicting(row, ctx.temperature), dim=-1, dtype=torch.float32)  # [T-1, V]
            row_grad.mul_(-grad[b, :, None]).scatter_add_(-1, targets[b], grad[b, :, None])
            grad_logits[b, :-1] = row_grad
        return grad_logits, None, None, None
