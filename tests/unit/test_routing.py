"""A mixture of experts' routing as the trainer measures it (training/routing.py), against float64 references built
from the model's own router logits (transformers' `output_router_logits`), not from the hooks under test."""

import json

import pytest
import torch

from oxrl_core.models.tiny import resolve_tiny_model
from oxrl_core.training.routing import RouterRecord, expert_load_metrics

E, K = 8, 2  # the tiny mixtures' experts and choices per token


@pytest.fixture(scope="module")
def moe():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        resolve_tiny_model("oxrl-tiny-qwen3-moe"), dtype=torch.float32
    )  # grouped_mm: no float64


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, 400, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # the second row right-padded: its last 5 positions are no tokens
    return ids, mask


@torch.no_grad()
def reference(model, ids, mask) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each layer's tokens per expert over the real tokens, and Switch's loss E * sum_e f_e P_e over every layer's real
    tokens (f_e: expert e's share of the top-k choices per token, P_e: its mean router probability), in float64."""
    out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    real = mask.reshape(-1).bool()
    probs = [torch.softmax(logits.double(), -1)[real] for logits in out.router_logits]  # [tokens, E] per layer
    counts = [torch.bincount(p.topk(K, -1).indices.reshape(-1), minlength=E) for p in probs]
    f = torch.stack(counts).sum(0).double() / (real.sum() * len(probs))
    p_mean = torch.cat(probs).mean(0)
    return counts, E * (f * p_mean).sum()


def test_the_record_counts_each_layers_chosen_experts_over_the_real_tokens_and_gives_the_models_balancing_loss(moe):
    ids, mask = batch()
    record = RouterRecord(moe, "Qwen3MoeTopKRouter", aux_loss_coef=None)
    with record.recording(mask) as balancing:
        moe(input_ids=ids, attention_mask=mask)
    counts, switch_loss = reference(moe, ids, mask)
    assert record.tokens.tolist() == [c.tolist() for c in counts]
    assert record.tokens.sum(1).tolist() == [int(mask.sum()) * K] * 2  # 19 tokens, 2 choices each, in each layer
    assert float(balancing[0].detach()) == pytest.approx(float(switch_loss), rel=1e-6)
    assert record.step_metrics()["router_aux_loss"] == pytest.approx(float(switch_loss), rel=1e-6)


def test_the_balancing_loss_reaches_every_router_and_nothing_is_recorded_outside_the_block(moe):
    ids, mask = batch()
    record = RouterRecord(moe, "Qwen3MoeTopKRouter", aux_loss_coef=1.0)
    moe.zero_grad()
    with record.recording(None) as balancing:  # None: every position is a token, as in a packed row
        moe(input_ids=ids)
    balancing[0].backward()
    assert all(router.weight.grad.abs().sum() > 0 for router in record.routers)
    assert record.tokens.sum().item() == ids.numel() * K * 2
    moe(input_ids=ids)  # after the block: its hooks are gone
    assert record.tokens.sum().item() == ids.numel() * K * 2 and record.step_metrics()["routes_compared"] == 0
    record.start_step()
    assert record.tokens.sum().item() == 0 and record.aux_losses == []


def engine_routes(own: list[torch.Tensor]) -> torch.Tensor:
    """Routes as an engine that disagreed with the trainer would record them [N, L, k]: token 0 of each layer the
    router's own experts (reversed: the same set), every other token the experts after its own (e + 1, mod E), and
    the padded second row's positions and the first row's last token none (-1)."""
    routes = torch.stack([(o + 1) % E for o in own], 1)  # [N, L, k]
    routes[0] = torch.stack([o[0].flip(0) for o in own])
    routes[12 - 1] = -1  # the first row's last token: nothing predicts from it
    routes[12 + 7 :] = -1  # the second row's padding
    return routes


def own_experts(model, ids, mask) -> list[torch.Tensor]:
    out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    return [logits.topk(K, -1).indices for logits in out.router_logits]  # [N, k] per layer


def test_replayed_routes_are_the_experts_every_layer_uses_with_the_current_routers_weights_and_the_router_learns(moe):
    """Router replay: each layer's experts get the engine's recorded choice where there is one and the router's own
    elsewhere, weighted by the router's current probabilities at them (renormalised), and the routers still get
    gradients; the agreement counts the token-layers whose own top-k was the recorded set."""
    ids, mask = batch()
    with torch.no_grad():
        routes = engine_routes(own_experts(moe, ids, mask))
    used = []
    experts = [m for m in moe.modules() if type(m).__name__ == "Qwen3MoeExperts"]
    hooks = [m.register_forward_pre_hook(lambda m, args: used.append((args[1], args[2]))) for m in experts]
    record = RouterRecord(moe, "Qwen3MoeTopKRouter", aux_loss_coef=None, replay=True)
    moe.zero_grad()
    try:
        with record.recording(mask, routes.reshape(-1, 2, K)):
            out = moe(input_ids=ids, attention_mask=mask, output_router_logits=True)
    finally:
        for h in hooks:
            h.remove()
    known = routes[:, 0, 0] >= 0
    for layer, ((index, weights), logits) in enumerate(zip(used, out.router_logits)):
        own = logits.topk(K, -1).indices
        assert torch.equal(index[known], routes[known, layer]) and torch.equal(index[~known], own[~known])
        probs = torch.softmax(logits.detach().double(), -1).gather(-1, index)
        expected = probs / probs.sum(-1, keepdim=True) if moe.config.norm_topk_prob else probs
        assert torch.allclose(weights.double(), expected, atol=1e-6)
    (out.logits.logsumexp(-1) - out.logits[..., 0]).sum().backward()
    assert all(router.weight.grad.abs().sum() > 0 for router in record.routers)
    metrics = record.step_metrics()
    assert (metrics["routes_compared"], metrics["routes_agreed"]) == (int(known.sum()) * 2, 2)  # token 0, each layer


def test_without_replay_the_routers_choose_and_the_engines_routes_are_only_compared(moe):
    ids, mask = batch()
    with torch.no_grad():
        own = own_experts(moe, ids, mask)
        routes = engine_routes(own)
        record = RouterRecord(moe, "Qwen3MoeTopKRouter", aux_loss_coef=None)
        with record.recording(mask, routes.reshape(-1, 2, K)):
            moe(input_ids=ids, attention_mask=mask)
    counts, _ = reference(moe, ids, mask)
    assert record.tokens.tolist() == [c.tolist() for c in counts]  # the routers' own choices were used
    metrics = record.step_metrics()
    assert (metrics["routes_compared"], metrics["routes_agreed"]) == (int((routes[:, 0, 0] >= 0).sum()) * 2, 2)


def test_a_model_without_the_router_is_refused(moe):
    with pytest.raises(ValueError, match="Qwen3MoeForCausalLM has no Qwen2MoeTopKRouter module"):
        RouterRecord(moe, "Qwen2MoeTopKRouter", aux_loss_coef=None)


def test_the_steps_expert_load_adds_the_ranks_tokens_and_writes_them_per_expert(tmp_path):
    routes = {"routes_compared": 0, "routes_agreed": 0}  # the samples came without the engine's routes
    ranks = [
        {"expert_tokens": [[4, 0, 2, 2], [1, 1, 1, 1]], "router_aux_loss": 1.25, "loss": 0.5, **routes},
        {"expert_tokens": [[0, 4, 2, 2], [3, 3, 3, 3]], "router_aux_loss": 1.75, "loss": 0.5, **routes},
    ]
    metrics = expert_load_metrics(ranks, tmp_path, step=7)
    # layer 0: [4, 4, 4, 4], balanced though neither rank's alone is; layer 1: [4, 4, 4, 4] too
    assert metrics == {
        "router_aux_loss": 1.5,
        "expert_load_max_over_mean": 1.0,
        "expert_load_max_over_mean/layer_0": 1.0,
        "expert_load_max_over_mean/layer_1": 1.0,
    }
    skewed = {"expert_tokens": [[6, 0, 1, 1]], "router_aux_loss": 2.0, "routes_compared": 8, "routes_agreed": 6}
    skewed = expert_load_metrics([skewed, skewed | {"routes_compared": 4, "routes_agreed": 0}], tmp_path, step=8)
    assert skewed["expert_load_max_over_mean"] == 3.0  # 12 of 16 choices on one expert of 4: 12 / 4
    assert skewed["routing_agreement"] == 0.5  # the ranks' 6 of 12 token-layers
    lines = [json.loads(line) for line in (tmp_path / "expert_load.jsonl").read_text().splitlines()]
    assert lines == [
        {"step": 7, "tokens_per_expert": [[4, 4, 4, 4], [4, 4, 4, 4]]},
        {"step": 8, "tokens_per_expert": [[12, 0, 2, 2]]},
    ]
    assert expert_load_metrics([{"loss": 0.5}], tmp_path, step=9) == {}  # a dense model reports none
