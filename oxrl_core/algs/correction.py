"""Sampler-trainer correction: importance weights for the gap between vLLM's and the trainer's probabilities.

vLLM samples with kernels of its own (on GPUs in bfloat16), so the policy that sampled a token, q, is not exactly
the policy the trainer scores, p_old; the losses are expectations under p_old. Weighting each token's loss by
w = p_old / q makes them so, and bounding w keeps a rare huge weight from dominating a step (Yao et al. 2025,
"Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"; the four modes are TRL's):

    token-*:    w_t = exp(old_t - sampler_t)            one weight per token
    sequence-*: w   = exp(sum_t (old_t - sampler_t))    one per sample, on all its tokens
    *-truncate (TIS): min(max(w, floor), cap)
    *-mask (MIS):     w where floor <= w <= cap, else 0 (the token or sample leaves the loss)

The weights are data (computed once per step, before the update) and multiply each loss's per-token policy term.
"""

from typing import Literal

import torch

Correction = Literal["none", "token-truncate", "token-mask", "sequence-truncate", "sequence-mask"]


def importance_weights(
    old_logprobs: torch.Tensor,  # [B, T-1] the trainer's, before the update
    sampler_logprobs: torch.Tensor,  # [B, T-1] vLLM's, of the same tokens
    mask: torch.Tensor,  # [B, T-1] response tokens
    mode: Correction,
    cap: float,
    floor: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The weights [B, T-1] (1 off the response and with mode `none`) and, summed over the response tokens, the gap
    whatever the mode (|log p_old - log q| and Schulman's k3 estimate of KL(q || p_old)), the largest raw weight and
    how many tokens were truncated or masked."""
    on = mask > 0
    log_w_token = (old_logprobs - sampler_logprobs) * mask  # [B, T-1]
    gap = {
        "gap_abs_sum": log_w_token[on].abs().sum().item(),
        "tokens": on.sum().item(),
        "gap_kl_sum": (torch.exp(log_w_token) - log_w_token - 1)[on].sum().item(),
    }
    log_w = log_w_token
    if mode.startswith("sequence"):
        log_w = log_w.sum(-1, keepdim=True).expand_as(mask)  # [B, T-1], each row its sample's weight
    raw = torch.exp(log_w)
    outside = (raw < floor) | (raw > cap)
    if mode.endswith("truncate"):
        weights = raw.clamp(floor, cap)
    elif mode.endswith("mask"):
        weights = raw.masked_fill(outside, 0.0)
    else:
        weights, outside = torch.ones_like(raw), torch.zeros_like(outside)
    return weights * on + ~on, gap | {
        "is_ratio_max": raw[on].max().item() if on.any() else 1.0,
        "is_corrected_tokens": outside[on].sum().item(),
    }
