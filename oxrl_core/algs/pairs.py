"""The metric sums every pairwise preference loss reports (DPO, IPO, SimPO, ORPO, RM)."""

import torch


def pair_metrics(reward_chosen: torch.Tensor, reward_rejected: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sums over a micro-batch of [N] implicit (or model) rewards, zero on filler pairs (`valid` False)."""
    return {
        "reward_chosen_sum": reward_chosen.sum().detach(),
        "reward_rejected_sum": reward_rejected.sum().detach(),
        "reward_correct_sum": (reward_chosen > reward_rejected).sum().float(),  # filler rows tie at 0: not counted
        "reward_margin_sum": (reward_chosen - reward_rejected).sum().detach(),
        "pairs": valid.sum().float(),
    }
