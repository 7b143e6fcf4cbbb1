"""Advantages: the formulas, and the estimators the algorithms name (`Algorithm.advantages`).

An estimator works in place on a step's micro-batches (every rank's, in order), after the trainer's logprobs are
known. Each micro-batch holds its samples' `rewards` [B] and `group_ids` [B] (the prompt each came from),
`response_mask` and `old_logprobs` [B, T-1], `ref_logprobs` [B, T-1] when its kl_coeff > 0, and PPO's
`old_values` [B, T-1]. It writes `advantages`: [B] for one per sample, [B, T-1] for one per token.
"""

from collections.abc import Callable
from typing import Literal

import torch

from oxrl_core.algs.base import Batch

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


def leave_one_out(
    rewards: torch.Tensor,  # [N] one reward per sample
    group_ids: torch.Tensor,  # [N] prompt index of each sample
) -> torch.Tensor:  # [N]
    """RLOO's advantage (Ahmadian et al. 2024, arXiv 2402.14740): each sample's reward less the mean reward of the
    other samples of its group, A_i = R_i - (sum_G R - R_i) / (G - 1)."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    counts = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, torch.ones_like(rewards))
    sums = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards)
    return rewards - (sums[inverse] - rewards) / (counts[inverse] - 1)


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


def _gathered(batches: list[Batch], key: str) -> torch.Tensor:
    """[N]: every sample's `rewards` or `group_ids`, in micro-batch order."""
    return torch.cat([b[key] for b in batches])


def _scatter(batches: list[Batch], advantages: torch.Tensor) -> None:
    """[N] per-sample advantages back onto their micro-batches."""
    for b, part in zip(batches, advantages.split([len(b["rewards"]) for b in batches])):
        b["advantages"] = part


def group_relative(batches: list[Batch], settings) -> None:
    """GRPO's family: group-centred rewards, scaled by its `adv_std_norm`."""
    rewards, group_ids = _gathered(batches, "rewards"), _gathered(batches, "group_ids")
    _scatter(batches, group_advantages(rewards, group_ids, settings.adv_std_norm))


def rloo(batches: list[Batch], settings) -> None:
    """Leave-one-out advantages; with kl_coeff > 0 each reward first loses kl_coeff x its sample's summed k1 KL to
    the reference, sum_t (old_t - ref_t), as in RLOO's paper and TRL."""
    rewards, group_ids = _gathered(batches, "rewards"), _gathered(batches, "group_ids")
    if settings.kl_coeff > 0:
        kl = torch.cat([((b["old_logprobs"] - b["ref_logprobs"]) * b["response_mask"]).sum(-1) for b in batches])
        rewards = rewards - settings.kl_coeff * kl
    _scatter(batches, leave_one_out(rewards, group_ids))


def _token_advantages(batches: list[Batch], rewards: torch.Tensor, settings, lam: float, critic: bool) -> None:
    """Per token: each sequence's reward sits on its last response token, less a per-token k1 KL penalty to the
    reference when kl_coeff > 0 (InstructGPT's shaping); GAE over the critic's old values (or none: then the
    discounted return) gives `advantages` and `returns` [B, T-1]; unless adv_std_norm is none, advantages are
    whitened over every response token of the batch."""
    for b, sequence_rewards in zip(batches, rewards.split([len(b["rewards"]) for b in batches])):
        mask = b["response_mask"]
        token_rewards = torch.zeros_like(mask)
        last = (mask * torch.arange(mask.shape[1])).argmax(-1)  # prediction-aligned index of each last token
        token_rewards[torch.arange(len(mask)), last] = sequence_rewards * mask.amax(-1)
        if settings.kl_coeff > 0:
            token_rewards -= settings.kl_coeff * (b["old_logprobs"] - b["ref_logprobs"]) * mask
        values = b["old_values"] if critic else torch.zeros_like(mask)
        b["advantages"], b["returns"] = gae(token_rewards, values, mask, settings.gamma, lam)
    if settings.adv_std_norm != "none":
        tokens = torch.cat([b["advantages"][b["response_mask"] > 0] for b in batches])
        mean, std = tokens.mean(), tokens.std(unbiased=False)
        for b in batches:
            b["advantages"] = (b["advantages"] - mean) / (std + 1e-6) * b["response_mask"]


def gae_advantages(batches: list[Batch], settings) -> None:
    """PPO: GAE from its critic's old values."""
    _token_advantages(batches, _gathered(batches, "rewards"), settings, settings.lam, critic=True)


def reinforce_pp(batches: list[Batch], settings) -> None:
    """REINFORCE++ (Hu et al. 2025, arXiv 2501.03262): the discounted return of the KL-shaped token rewards,
    normalised over the whole batch (no critic, no per-prompt baseline)."""
    _token_advantages(batches, _gathered(batches, "rewards"), settings, lam=1.0, critic=False)


def reinforce_pp_baseline(batches: list[Batch], settings) -> None:
    """REINFORCE++-baseline: the same, after each reward loses its group's mean reward."""
    rewards, group_ids = _gathered(batches, "rewards"), _gathered(batches, "group_ids")
    _token_advantages(batches, group_advantages(rewards, group_ids, "none"), settings, lam=1.0, critic=False)


ESTIMATORS: dict[str, Callable[[list[Batch], object], None]] = {  # the names of `base.Estimator`
    "group": group_relative,
    "leave-one-out": rloo,
    "reinforce++": reinforce_pp,
    "reinforce++-baseline": reinforce_pp_baseline,
    "gae": gae_advantages,
}
