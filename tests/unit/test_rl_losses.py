"""RL losses and advantages against independent float64 references written as plain loops."""

import math
import random

import pytest
import torch

from oxrl_core.algs.advantages import gae, group_advantages
from oxrl_core.algs.aggregate import aggregate
from oxrl_core.algs.cispo import cispo_loss
from oxrl_core.algs.ppo import ppo_loss
from oxrl_core.algs.sgrpo import sgrpo_loss

TOL = 1e-6


def random_batch(seed, B=4, T=7):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5)  # ratios spread across the clip range
    mask = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        start, stop = 1 + b % 2, T - b % 3
        mask[b, start:stop] = 1
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, adv, mask


def ref_aggregate(per_token, mask, mode, max_tokens):
    """Plain-Python aggregation over lists."""
    B, T = len(per_token), len(per_token[0])
    if mode == "token-mean":
        return sum(per_token[b][t] for b in range(B) for t in range(T) if mask[b][t]) / sum(map(sum, mask))
    seq = []
    for b in range(B):
        s = sum(per_token[b][t] for t in range(T) if mask[b][t])
        seq.append(s / sum(mask[b]) if mode == "seq-mean-token-mean" else s / max_tokens)
    return sum(seq) / B


MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sgrpo_matches_the_formula(mode, seed):
    logp, old, adv, mask = random_batch(seed)
    ref = logp - 0.3
    loss, _ = sgrpo_loss(
        logp,
        old,
        adv,
        mask,
        torch.ones_like(mask),
        ref,
        clip_low=0.2,
        clip_high=0.28,
        kl_coeff=0.05,
        loss_agg=mode,
        num_tokens=mask.sum().item(),
        num_seqs=4,
        max_tokens=10,
    )
    per_token = []
    for b in range(4):
        row = []
        for t in range(7):
            r = math.exp(logp[b, t] - old[b, t])
            a = adv[b].item()
            surrogate = min(r * a, min(max(r, 0.8), 1.28) * a)
            d = ref[b, t].item() - logp[b, t].item()
            row.append(-surrogate + 0.05 * (math.exp(d) - d - 1))
        per_token.append(row)
    assert abs(loss.item() - ref_aggregate(per_token, mask.tolist(), mode, 10)) <= TOL


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 3])
def test_cispo_matches_the_formula(mode, seed):
    logp, old, adv, mask = random_batch(seed)
    loss, _ = cispo_loss(
        logp,
        old,
        adv,
        mask,
        torch.ones_like(mask),
        clip_low=0.2,
        clip_high=0.28,
        loss_agg=mode,
        num_tokens=mask.sum().item(),
        num_seqs=4,
        max_tokens=10,
    )
    per_token = [
        [-min(max(math.exp(logp[b, t] - old[b, t]), 0.8), 1.28) * adv[b].item() * logp[b, t].item() for t in range(7)]
        for b in range(4)
    ]
    assert abs(loss.item() - ref_aggregate(per_token, mask.tolist(), mode, 10)) <= TOL


def one_token(ratio, advantage):
    logp = torch.tensor([[math.log(ratio) - 1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    return logp, old, torch.tensor([advantage], dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64)


KW = dict(clip_low=0.2, clip_high=0.28, loss_agg="token-mean", num_tokens=1.0, num_seqs=1.0, max_tokens=1.0)


@pytest.mark.parametrize(
    "ratio, advantage, clipped",
    [
        (1.5, 1.0, True),  # above 1 + clip_high with a positive advantage: PPO stops pushing up
        (0.5, -1.0, True),  # below 1 - clip_low with a negative advantage: PPO stops pushing down
        (1.27, 1.0, False),  # just inside the high boundary
        (0.81, -1.0, False),  # just inside the low boundary
        (0.5, 1.0, False),  # below the range but the advantage wants it up: min() keeps the gradient
    ],
)
def test_clip_boundaries_and_cispo_keeps_gradient_where_ppo_has_none(ratio, advantage, clipped):
    logp, old, adv, mask = one_token(ratio, advantage)
    sgrpo_loss(logp, old, adv, mask, torch.ones_like(mask), None, kl_coeff=0.0, **KW)[0].backward()
    ppo_grad = logp.grad.item()
    assert (ppo_grad == 0.0) == clipped

    logp, old, adv, mask = one_token(ratio, advantage)
    cispo_loss(logp, old, adv, mask, torch.ones_like(mask), **KW)[0].backward()
    weight = min(max(ratio, 0.8), 1.28)
    assert abs(logp.grad.item() - (-weight * advantage)) <= TOL  # non-zero even where PPO's is zero


def test_ppo_loss_matches_the_formula():
    logp, old, _, mask = random_batch(5)
    g = torch.Generator().manual_seed(9)
    adv, values, old_values, returns, entropy = (torch.randn(4, 7, generator=g, dtype=torch.float64) for _ in range(5))
    loss, _ = ppo_loss(
        logp,
        old,
        adv,
        mask,
        torch.ones_like(mask),
        values,
        old_values,
        returns,
        entropy.abs(),
        clip_low=0.2,
        clip_high=0.2,
        value_clip=0.1,
        vf_coeff=0.5,
        entropy_coeff=0.01,
        loss_agg="token-mean",
        num_tokens=mask.sum().item(),
        num_seqs=4,
        max_tokens=10,
    )
    total = n = 0.0
    for b in range(4):
        for t in range(7):
            if not mask[b, t]:
                continue
            r, a = math.exp(logp[b, t] - old[b, t]), adv[b, t].item()
            policy = -min(r * a, min(max(r, 0.8), 1.2) * a)
            v, v_old, ret = values[b, t].item(), old_values[b, t].item(), returns[b, t].item()
            v_clipped = v_old + min(max(v - v_old, -0.1), 0.1)
            value = 0.5 * max((v - ret) ** 2, (v_clipped - ret) ** 2)
            total += policy + 0.5 * value - 0.01 * abs(entropy[b, t].item())
            n += 1
    assert abs(loss.item() - total / n) <= TOL


def test_gae_matches_a_plain_reference_loop():
    rng = random.Random(0)
    B, L, gamma, lam = 3, 9, 0.99, 0.95
    mask = torch.zeros(B, L, dtype=torch.float64)
    spans = [(2, 9), (1, 5), (3, 7)]  # prompt positions before, padding after
    for b, (s, e) in enumerate(spans):
        mask[b, s:e] = 1
    rewards = torch.tensor([[rng.gauss(0, 1) for _ in range(L)] for _ in range(B)], dtype=torch.float64) * mask
    values = torch.tensor([[rng.gauss(0, 1) for _ in range(L)] for _ in range(B)], dtype=torch.float64)
    adv, ret = gae(rewards, values, mask, gamma, lam)
    for b, (s, e) in enumerate(spans):
        expected, running = [0.0] * L, 0.0
        for t in range(e - 1, s - 1, -1):
            next_v = values[b, t + 1].item() if t + 1 < e else 0.0
            delta = rewards[b, t].item() + gamma * next_v - values[b, t].item()
            running = delta + gamma * lam * running
            expected[t] = running
        for t in range(L):
            assert abs(adv[b, t].item() - expected[t]) <= TOL
            assert abs(ret[b, t].item() - (expected[t] + values[b, t].item() if mask[b, t] else 0.0)) <= TOL


def test_group_advantages_match_mean_and_population_std_per_group():
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, 3.0, 3.5], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = group_advantages(rewards, groups)
    for idx in ([0, 1, 2], [3, 4, 5]):
        values = [rewards[i].item() for i in idx]
        mean = sum(values) / 3
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / 3)
        for i in idx:
            assert abs(adv[i].item() - (rewards[i].item() - mean) / (std + 1e-6)) <= TOL
    no_std = group_advantages(rewards, groups, std_norm="none")
    assert abs(no_std[0].item() - (1.0 - 0.5)) <= TOL


def test_equal_rewards_give_zero_advantages_not_nan():
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 1, 1]))
    assert torch.isfinite(adv).all() and adv[:3].abs().max() == 0 and adv[3] < 0 < adv[4]


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_over_micro_batches_equals_the_whole_batch(mode):
    g = torch.Generator().manual_seed(4)
    per_token = torch.randn(6, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(6, 5, generator=g) > 0.3).double()
    mask[:, 0] = 1
    kw = dict(num_tokens=mask.sum().item(), num_seqs=6, max_tokens=5)
    whole = aggregate(per_token, mask, mode, **kw)
    parts = aggregate(per_token[:2], mask[:2], mode, **kw) + aggregate(per_token[2:], mask[2:], mode, **kw)
    assert abs(whole.item() - parts.item()) <= 1e-12
    assert abs(whole.item() - ref_aggregate(per_token.tolist(), mask.tolist(), mode, 5)) <= TOL


@pytest.mark.parametrize("whiten", [False, True])
def test_ppo_reward_sits_on_the_last_response_token_less_the_kl_penalty(whiten):
    from types import SimpleNamespace

    from oxrl_core.algs.advantages import gae_advantages

    g = torch.Generator().manual_seed(3)
    mask = torch.tensor(
        [[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.float64
    )  # last row: masked out
    rewards = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    old, ref, values = (torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(3))
    batch = {
        "response_mask": mask,
        "rewards": rewards.clone(),
        "old_logprobs": old,
        "ref_logprobs": ref,
        "old_values": values,
    }
    train = SimpleNamespace(kl_coeff=0.1, gamma=0.9, lam=0.8, adv_std_norm="batch" if whiten else "none")
    gae_advantages([batch], train)
    expected, returns = [[0.0] * 5 for _ in range(3)], [[0.0] * 5 for _ in range(3)]
    for b in range(3):
        positions = [t for t in range(5) if mask[b, t]]
        running = 0.0
        for i in reversed(range(len(positions))):
            t = positions[i]
            r = -0.1 * (old[b, t].item() - ref[b, t].item()) + (rewards[b].item() if i == len(positions) - 1 else 0.0)
            next_v = values[b, positions[i + 1]].item() if i + 1 < len(positions) else 0.0
            running = r + 0.9 * next_v - values[b, t].item() + 0.9 * 0.8 * running
            expected[b][t], returns[b][t] = running, running + values[b, t].item()
    if whiten:
        flat = [expected[b][t] for b in range(3) for t in range(5) if mask[b, t]]
        mean = sum(flat) / len(flat)
        std = math.sqrt(sum((x - mean) ** 2 for x in flat) / len(flat))
        expected = [
            [(x - mean) / (std + 1e-6) if mask[b, t] else 0.0 for t, x in enumerate(row)]
            for b, row in enumerate(expected)
        ]
    assert torch.allclose(batch["advantages"], torch.tensor(expected, dtype=torch.float64), atol=TOL)
    assert torch.allclose(batch["returns"], torch.tensor(returns, dtype=torch.float64), atol=TOL)
