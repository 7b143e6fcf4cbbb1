"""Per-token log-probabilities and entropies, prediction-aligned (DESIGN.md).

Both work one sequence at a time in float32, so no [B, T, V] float32 tensor ever
exists: with a 150k vocabulary that tensor alone is 3 GB for 8 x 640 tokens.
The logprobs' backward is written out (softmax minus one-hot, straight into one
gradient tensor of the logits' dtype) rather than recomputed by autograd.
"""

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits [B, T, V], input_ids [B, T] -> [B, T-1] with out[b, t] = log p(x[b, t+1] | x[b, :t+1]),
    p the softmax of logits / temperature (the distribution vLLM sampled from)."""
    return _TokenLogprobs.apply(logits, input_ids, temperature)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits [B, T, V] -> [B, T-1]: entropy of the next-token distribution at each predicting position."""
    rows = []
    for row in logits.unbind():  # unbind: the backward stacks the rows' gradients once
        log_p = torch.log_softmax(row[:-1].float() / temperature, dim=-1)  # [T-1, V]
        rows.append(-(log_p.exp() * log_p).sum(-1))
    return torch.stack(rows)


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, input_ids, temperature):  # [B, T, V], [B, T], float
        targets = input_ids[:, 1:, None]  # [B, T-1, 1]
        lse = torch.stack([torch.logsumexp(row[:-1].float() / temperature, dim=-1) for row in logits])  # [B, T-1]
        picked = logits[:, :-1].gather(-1, targets).squeeze(-1).float() / temperature
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        return picked - lse

    @staticmethod
    def backward(ctx, grad):  # grad [B, T-1]
        logits, targets, lse = ctx.saved_tensors
        # d(x_target/T - lse)/dx = (onehot(target) - softmax(x/T)) / T at each predicting position; 0 at the last
        grad_logits = torch.empty_like(logits)
        grad_logits[:, -1] = 0
        for b in range(len(logits)):
            row = -torch.exp(logits[b, :-1].float() / ctx.temperature - lse[b, :, None]) * grad[b, :, None]
            row.scatter_add_(-1, targets[b], grad[b, :, None])
            grad_logits[b, :-1] = row / ctx.temperature
        return grad_logits, None, None
