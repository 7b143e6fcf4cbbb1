"""Per-row float32 logprobs and entropies against a float64 full-vocabulary reference, values and gradients."""

import torch

from oxrl_core.training.logprobs import token_entropy, token_logprobs, token_logprobs_and_entropy_metric


def reference(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    log_p = torch.log_softmax(logits[:, :-1].double() / temperature, dim=-1)
    return log_p.gather(-1, ids[:, 1:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def test_logprobs_and_entropy_match_the_full_softmax_with_their_gradients():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 50, generator=g) * 3
    ids = torch.randint(0, 50, (3, 6), generator=g)
    weights_lp, weights_h = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    for temperature in (1.0, 0.7):
        mine = logits.clone().requires_grad_()
        lp, h = token_logprobs(mine, ids, temperature), token_entropy(mine, temperature)
        ((lp * weights_lp).sum() + (h * weights_h).sum()).backward()
        ref = logits.double().requires_grad_()
        ref_lp, ref_h = reference(ref, ids, temperature)
        ((ref_lp * weights_lp.double()).sum() + (ref_h * weights_h.double()).sum()).backward()
        assert torch.allclose(lp.double(), ref_lp, atol=1e-5) and torch.allclose(h.double(), ref_h, atol=1e-5)
        assert torch.allclose(mine.grad.double(), ref.grad, atol=1e-5)


def test_entropy_metric_from_the_logprobs_softmax_matches_and_leaves_the_logprob_gradient_alone():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 7, 40, generator=g) * 2
    ids = torch.randint(0, 40, (2, 7), generator=g)
    weights = torch.randn(2, 6, generator=g)
    for temperature in (1.0, 0.6):
        mine = logits.clone().requires_grad_()
        lp, h = token_logprobs_and_entropy_metric(mine, ids, temperature)
        assert not h.requires_grad
        (lp * weights).sum().backward()
        ref = logits.double().requires_grad_()
        ref_lp, ref_h = reference(ref, ids, temperature)
        (ref_lp * weights.double()).sum().backward()
        assert torch.allclose(lp.double(), ref_lp, atol=1e-5) and torch.allclose(h.double(), ref_h, atol=1e-5)
        assert torch.allclose(mine.grad.double(), ref.grad, atol=1e-5)
