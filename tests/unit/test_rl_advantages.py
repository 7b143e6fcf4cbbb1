"""RLOO's and REINFORCE++'s advantages equal the papers' formulas, written here in float64 Python, on a step's
micro-batches; DAPO's overlong penalty is exact at its edges."""

import math
from types import SimpleNamespace

import pytest
import torch

from oxrl_core.algs.advantages import ESTIMATORS, leave_one_out
from oxrl_core.rewards.length import overlong_penalty

G = 4  # samples per prompt


def step_batches(seed: int, n_prompts: int = 3, per_micro_batch: int = 4):
    """Micro-batches of n_prompts x G samples, with rewards, group ids, masks and logprobs (float64)."""
    g = torch.Generator().manual_seed(seed)
    n = n_prompts * G
    rewards = torch.randint(0, 3, (n,), generator=g).double()
    mask = torch.zeros(n, 6, dtype=torch.float64)
    for i in range(n):
        start, length = int(torch.randint(0, 2, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g))
        mask[i, start : start + length] = 1.0
    old, ref = (-torch.rand(n, 6, generator=g, dtype=torch.float64) for _ in range(2))
    group_ids = torch.arange(n) // G
    cuts = range(0, n, per_micro_batch)
    return [
        {
            "rewards": rewards[c : c + per_micro_batch],
            "group_ids": group_ids[c : c + per_micro_batch],
            "response_mask": mask[c : c + per_micro_batch],
            "old_logprobs": old[c : c + per_micro_batch],
            "ref_logprobs": ref[c : c + per_micro_batch],
        }
        for c in cuts
    ]


def whole(batches, key):
    return torch.cat([b[key] for b in batches]).tolist()


def test_leave_one_out_is_each_reward_less_the_mean_of_the_others():
    rewards, groups = torch.tensor([1.0, 0.0, 3.0, 2.0, 5.0]), torch.tensor([0, 0, 0, 1, 1])
    assert leave_one_out(rewards, groups).tolist() == [1 - 1.5, 0 - 2.0, 3 - 0.5, 2 - 5.0, 5 - 2.0]


@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_rloo_advantages_take_the_summed_kl_into_the_reward_first(beta):
    batches = step_batches(0)
    rewards, mask, old, ref = (whole(batches, k) for k in ("rewards", "response_mask", "old_logprobs", "ref_logprobs"))
    shaped = [r - beta * sum((o - f) * m for o, f, m in zip(old[i], ref[i], mask[i])) for i, r in enumerate(rewards)]
    expected = []
    for i, r in enumerate(shaped):
        others = [shaped[j] for j in range(len(shaped)) if j // G == i // G and j != i]
        expected.append(r - sum(others) / len(others))
    ESTIMATORS["leave-one-out"](batches, SimpleNamespace(kl_coeff=beta))
    assert torch.allclose(
        torch.cat([b["advantages"] for b in batches]), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12
    )


def reinforce_pp_reference(batches, beta: float, gamma: float, baseline: bool) -> list[list[float]]:
    """Per token: r_t = -beta (old_t - ref_t), plus the (group-centred) reward on the last response token; the
    discounted return over the response's tokens; whitened over every response token of the batch."""
    rewards, mask, old, ref = (whole(batches, k) for k in ("rewards", "response_mask", "old_logprobs", "ref_logprobs"))
    if baseline:
        rewards = [
            r - sum(rewards[j] for j in range(len(rewards)) if j // G == i // G) / G for i, r in enumerate(rewards)
        ]
    returns = [[0.0] * len(row) for row in mask]
    for i, row in enumerate(mask):
        positions = [t for t, m in enumerate(row) if m]
        running = 0.0
        for k in reversed(range(len(positions))):
            t = positions[k]
            running = (
                -beta * (old[i][t] - ref[i][t]) + (rewards[i] if k == len(positions) - 1 else 0.0) + gamma * running
            )
            returns[i][t] = running
    flat = [returns[i][t] for i, row in enumerate(mask) for t, m in enumerate(row) if m]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / len(flat))
    return [
        [(returns[i][t] - mean) / (std + 1e-6) if m else 0.0 for t, m in enumerate(row)] for i, row in enumerate(mask)
    ]


@pytest.mark.parametrize("name", ["reinforce++", "reinforce++-baseline"])
@pytest.mark.parametrize("beta,gamma", [(0.0, 1.0), (0.05, 1.0), (0.05, 0.9)])
def test_reinforce_pp_advantages_are_the_whitened_returns_of_kl_shaped_rewards(name, beta, gamma):
    batches = step_batches(1)
    expected = reinforce_pp_reference(batches, beta, gamma, baseline=name.endswith("baseline"))
    ESTIMATORS[name](batches, SimpleNamespace(kl_coeff=beta, gamma=gamma, adv_std_norm="batch"))
    got = torch.cat([b["advantages"] for b in batches])
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-9)


def test_the_baseline_is_what_tells_the_two_reinforce_pp_apart():
    """A prompt whose samples all scored 2 moves nothing with the baseline, and is pushed up without it."""
    batches = step_batches(2)
    for b in batches:
        b["rewards"] = torch.where(b["group_ids"] == 0, 2.0, b["rewards"].double())
    train = SimpleNamespace(kl_coeff=0.0, gamma=1.0, adv_std_norm="none")
    ESTIMATORS["reinforce++-baseline"](batches, train)
    assert torch.all(batches[0]["advantages"] == 0)
    ESTIMATORS["reinforce++"](batches, train)
    assert torch.all(batches[0]["advantages"][batches[0]["response_mask"] > 0] == 2.0)


@pytest.mark.parametrize("length,expected", [(12, 0.0), (11, 0.0), (13, -0.25), (14, -0.5), (16, -1.0)])
def test_the_overlong_penalty_starts_after_max_minus_buffer_tokens_and_is_full_at_max(length, expected):
    """max_tokens 16, buffer 4: no penalty up to 12 tokens, then a quarter of it per token."""
    assert overlong_penalty(length, max_tokens=16, buffer=4, penalty=1.0) == expected


def test_the_overlong_penalty_scales_with_its_size():
    assert overlong_penalty(14, max_tokens=16, buffer=4, penalty=0.5) == -0.25
