"""The metric sums every pairwise preference loss reports (DPO, IPO, SimPO, ORPO, RM), and their means."""

import torch


def pair_metrics(
    reward_chosen: torch.Tensor, reward_rejected: torch.Tensor, valid: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Sums over a micro-batch of [N] implicit (or model) rewards, zero on filler pairs (`valid` False)."""
    return {
        "reward_chosen_sum": reward_chosen.sum().detach(),
        "reward_rejected_sum": reward_rejected.sum().detach(),
        "reward_correct_sum": (reward_chosen > reward_rejected).sum().float(),  # filler rows tie at 0: not counted
        "reward_margin_sum": (reward_chosen - reward_rejected).sum().detach(),
        "pairs": valid.sum().float(),
    }


def pair_means(sums: dict[str, float]) -> dict[str, float]:
    """The means over a batch's pairs, by TRL's names."""
    n = max(sums["pairs"], 1.0)
    return {
        "rewards/chosen": sums["reward_chosen_sum"] / n,
        "rewards/rejected": sums["reward_rejected_sum"] / n,
        "rewards/accuracies": sums["reward_correct_sum"] / n,
        "rewards/margins": sums["reward_margin_sum"] / n,
    }
