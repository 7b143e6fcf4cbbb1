"""GRPO against DeepSeekMath's objective written out token by token in float64, and its config checks."""

import math

import pytest
import torch

from oxrl_core.algs.grpo import grpo_loss
from oxrl_core.errors import OxrlError


def reference_loss(logp, old, adv, mask, ref, eps, beta):
    """-(1/G) Σ_i (1/|o_i|) Σ_t [min(r A, clip(r) A) - beta (π_ref/π - log(π_ref/π) - 1)], one number at a time."""
    total = 0.0
    for i in range(len(logp)):
        tokens = [t for t in range(len(logp[i])) if mask[i][t] > 0]
        inner = 0.0
        for t in tokens:
            r = math.exp(logp[i][t] - old[i][t])
            surrogate = min(r * adv[i], min(max(r, 1 - eps), 1 + eps) * adv[i])
            kl = math.exp(ref[i][t] - logp[i][t]) - (ref[i][t] - logp[i][t]) - 1
            inner += surrogate - beta * kl
        total += inner / max(len(tokens), 1)
    return -total / len(logp)


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_loss_and_its_gradient_match_the_papers_objective(beta):
    generator = torch.Generator().manual_seed(3)
    logp = -torch.rand(4, 6, generator=generator, dtype=torch.float64) * 3
    old = logp + torch.randn(4, 6, generator=generator, dtype=torch.float64) * 0.3  # ratios on both sides of the clip
    ref = logp + torch.randn(4, 6, generator=generator, dtype=torch.float64) * 0.2
    adv = torch.tensor([1.0, -0.5, 0.0, 2.0], dtype=torch.float64)
    mask = torch.tensor(
        [[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.float64
    )
    logp.requires_grad_(True)
    loss, metrics = grpo_loss(
        logp, old, adv, mask, torch.ones_like(mask), ref if beta else None, clip_low=0.2, kl_coeff=beta, num_seqs=4.0
    )
    expected = reference_loss(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), ref.tolist(), 0.2, beta)
    assert loss.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    loss.backward()
    step = 1e-6
    for i, t in [(0, 1), (1, 4), (0, 3)]:  # a central difference of the reference at a few tokens
        bumped = [logp.detach().clone() for _ in range(2)]
        bumped[0][i, t] += step
        bumped[1][i, t] -= step
        difference = reference_loss(
            bumped[0].tolist(), old.tolist(), adv.tolist(), mask.tolist(), ref.tolist(), 0.2, beta
        ) - reference_loss(bumped[1].tolist(), old.tolist(), adv.tolist(), mask.tolist(), ref.tolist(), 0.2, beta)
        assert logp.grad[i, t].item() == pytest.approx(difference / (2 * step), rel=1e-5, abs=1e-8)
    assert ("kl_ref_sum" in metrics) == (beta > 0)


@pytest.mark.parametrize(
    "alg, key, message",
    [
        ("grpo", "clip_high=0.3", "clips symmetrically"),
        ("grpo", "loss_agg=token-mean", "averages each sample's tokens"),
        ("dapo", "loss_agg=token-mean", "token-level by definition"),
        ("gspo", "loss_agg=token-mean", "mean over samples"),
        ("gspo-token", "loss_agg=token-mean", "mean over samples"),
        ("rloo", "loss_agg=token-mean", "mean over samples"),
        ("dr-grpo", "adv_std_norm=group", "does not scale advantages"),
        ("dr-grpo", "loss_agg=token-mean", "--alg sgrpo chooses it"),
    ],
)
def test_an_algorithm_refuses_a_setting_its_definition_fixes_saying_why(tmp_path, alg, key, message):
    from oxrl_core.config.load import load_config
    from oxrl_core.config.schema import RLConfig

    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    with pytest.raises(OxrlError, match=rf"unknown key 'train.{alg}.{key.split('=')[0]}' \(.*{message}"):
        load_config(
            RLConfig,
            None,
            [f"train.alg={alg}", f"data.train=[{{path: {data}}}]", f"run.output_dir={tmp_path}", f"train.{alg}.{key}"],
        )
