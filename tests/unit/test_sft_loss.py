"""The SFT loss and per-token logprobs against independent float64 references."""

import math

import torch

from oxrl_core.algs.sft import sft_loss
from oxrl_core.training.logprobs import token_logprobs


def test_token_logprobs_match_a_float64_softmax_loop():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    ids = torch.randint(0, 11, (2, 5))
    out = token_logprobs(logits, ids)
    assert out.shape == (2, 4)
    for b in range(2):
        for t in range(4):
            row = [float(x) for x in logits[b, t].double()]
            expected = row[ids[b, t + 1]] - math.log(sum(math.exp(x) for x in row))
            assert abs(out[b, t].item() - expected) <= 1e-6


def test_sft_loss_is_masked_nll_over_the_given_token_count():
    torch.manual_seed(1)
    logprobs = -torch.rand(3, 6, dtype=torch.float64)
    mask = (torch.rand(3, 6) > 0.4).double()
    mask[2] = 0  # a fully masked row contributes nothing
    loss, metrics = sft_loss(logprobs, mask, num_tokens=17.0)
    expected = sum(-logprobs[b, t].item() for b in range(3) for t in range(6) if mask[b, t]) / 17.0
    assert abs(loss.item() - expected) <= 1e-12
    assert metrics["tokens"] == mask.sum().item()


def test_sft_loss_gradient_reaches_only_response_positions():
    logprobs = torch.zeros(1, 4, requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    sft_loss(logprobs, mask, num_tokens=2.0)[0].backward()
    assert logprobs.grad.tolist() == [[0.0, -0.5, -0.5, 0.0]]
