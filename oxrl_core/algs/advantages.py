"""Advantages: group-relative (GRPO family) and GAE (PPO)."""

from typing import Literal

import torch

StdNorm = Literal["group", "batch", "none"]


def group_advantages(
    rewards: torch.Tensor,  # [N] one reward per sample
    group_ids: torch.Tensor,  # [N] prompt index of each sample
    std_norm: StdNorm = "group",
    eps: float = 1e-6,
) -> torch.Tensor:  # [N]
    """A_i = (R_i - mean of its group) / (std + eps); `none` is Dr. GRPO, `batch` uses the whole batch's std.

    A group whose rewards are all equal gets zeros (no signal), never NaN.
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    counts = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, torch.ones_like(rewards))
    means = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards) / counts
    centered = rewards - means[inverse]
    if std_norm == "none":
        return centered
    if std_norm == "batch":
        return centered / (rewards.std(unbiased=False) + eps)
    variances = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, centered**2) / counts
    return centered / (variances.sqrt()[inverse] + eps)


def gae(
    rewards: torch.Tensor,  # [B, L] reward at each response token (usually only the last is non-zero)
    values: torch.Tensor,  # [B, L] V(s_t) from the critic
    mask: torch.Tensor,  # [B, L] 1 on response tokens
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # advantages [B, L], returns [B, L]
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438), right to left:
    delta_t = r_t + gamma V_{t+1} - V_t,  A_t = delta_t + gamma lam A_{t+1}; the step after the last
    response token is terminal (V = 0). Returns are A + V.
    """
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        live = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = advantage * live
        # positions outside the response pass the running values through unchanged
        next_value = torch.where(live.bool(), values[:, t], next_value)
        next_advantage = torch.where(live.bool(), advantage, next_advantage)
    return advantages, advantages + values * mask


def gae_advantages(per_rank: list[list[dict[str, torch.Tensor]]], train) -> None:
    """PPO, in place on the step's micro-batches: each sequence's reward sits on its last response token, less a
    per-token KL penalty to the reference when kl_coeff > 0 (InstructGPT's shaping); GAE over the old values gives
    `advantages` and `returns` [B, T-1]. Unless adv_std_norm is none, advantages are whitened over all response
    tokens of the batch."""
    batches = [b for rank in per_rank for b in rank]
    for b in batches:
        mask = b["response_mask"]
        token_rewards = torch.zeros_like(mask)
        last = (mask * torch.arange(mask.shape[1])).argmax(-1)  # prediction-aligned index of each last token
        token_rewards[torch.arange(len(mask)), last] = b.pop("rewards") * mask.amax(-1)
        if train.kl_coeff > 0:
            token_rewards -= train.kl_coeff * (b["old_logprobs"] - b["ref_logprobs"]) * mask
        b["advantages"], b["returns"] = gae(token_rewards, b["old_values"], mask, train.gamma, train.lam)
    if train.adv_std_norm != "none":
        tokens = torch.cat([b["advantages"][b["response_mask"] > 0] for b in batches])
        mean, std = tokens.mean(), tokens.std(unbiased=False)
        for b in batches:
            b["advantages"] = (b["advantages"] - mean) / (std + 1e-6) * b["response_mask"]
