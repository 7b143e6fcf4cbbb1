"""Per-token log-probabilities, prediction-aligned (DESIGN.md)."""

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V], input_ids [B, T] -> [B, T-1] with out[b, t] = log p(x[b, t+1] | x[b, :t+1])."""
    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:].unsqueeze(-1)
    return logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
