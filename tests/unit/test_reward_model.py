"""The reward-model reward: scores equal to a plain per-sample Hugging Face forward, the errors a user can
cause, and `score_samples` calling `score_batch` once for a whole step."""

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from oxrl_core.errors import OxrlError
from oxrl_core.rewards import resolve_reward, score_samples
from oxrl_core.rewards.reward_model import RewardModel

SAMPLES = [
    {"prompt": "What is 2 + 3?", "answer": "5"},
    {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Hello, how are you?"},
        ]
    },
    {"prompt": [{"role": "user", "content": "What is 17 + 25?"}]},
]
RESPONSES = [
    "<answer>5</answer>",
    "I am fine, thank you for asking. The quick brown fox jumps over the lazy dog.",
    "42",
]
# The same conversations written out by hand: the prompt as load_prompts reads it, then the response.
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": RESPONSES[0]}],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hello, how are you?"},
        {"role": "assistant", "content": RESPONSES[1]},
    ],
    [{"role": "user", "content": "What is 17 + 25?"}, {"role": "assistant", "content": RESPONSES[2]}],
]


def save_classifier(folder, tiny_model_dir, num_labels=1, pad_token_id=0, chat_template=True):
    """The tiny model with a seeded scalar (or `num_labels`) head, saved with its tokenizer."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=num_labels)
        torch.nn.init.normal_(model.score.weight, std=1.0)
    model.config.pad_token_id = pad_token_id
    model.save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    if not chat_template:
        tokenizer.chat_template = None
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def rm_dir(tiny_model_dir, tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("rm"), tiny_model_dir)


def reference_scores(folder) -> list[float]:
    """Each conversation alone (no padding) through a freshly loaded model."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    scores = []
    with torch.no_grad():
        for messages in CONVERSATIONS:
            ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
            assert tokenizer.decode(ids).endswith(f"<|im_start|>assistant\n{messages[-1]['content']}<|im_end|>\n")
            scores.append(model(torch.tensor([ids])).logits[0, 0].item())
    return scores


def test_score_batch_equals_an_unpadded_per_sample_forward_for_every_batch_size(rm_dir):
    expected = reference_scores(rm_dir)
    for batch_size in (1, 2, 16):  # 1: no padding; 2 and 16: the shorter conversations right-padded
        scores = RewardModel(str(rm_dir), batch_size=batch_size).score_batch(RESPONSES, SAMPLES)
        assert scores == pytest.approx(expected, abs=1e-5), batch_size
    assert len(set(expected)) == 3


def test_called_with_one_sample_it_agrees_and_other_responses_score_differently(rm_dir):
    reward = RewardModel(str(rm_dir))
    batch = reward.score_batch(RESPONSES, SAMPLES)
    assert [reward(r, s) for r, s in zip(RESPONSES, SAMPLES)] == pytest.approx(batch, abs=1e-5)
    sample = SAMPLES[0]
    assert len({reward(response, sample) for response in ("<answer>5</answer>", "<answer>6</answer>", "no idea")}) == 3


def test_resolve_reward_loads_the_reward_model_with_its_kwargs(rm_dir):
    reward = resolve_reward("reward-model", {"path": str(rm_dir), "batch_size": 2})
    assert isinstance(reward, RewardModel) and reward.batch_size == 2
    assert reward.score_batch(RESPONSES, SAMPLES) == pytest.approx(reference_scores(rm_dir), abs=1e-5)
    assert resolve_reward("reward-model", {"path": str(rm_dir)}).batch_size == 16


def test_reward_model_mistakes_are_named_when_the_reward_is_resolved(rm_dir, tiny_model_dir, tmp_path):
    def error(kwargs) -> str:
        with pytest.raises(OxrlError) as e:
            resolve_reward("reward-model", kwargs)
        return str(e.value)

    assert "needs reward.kwargs.path" in error({"batch_size": 4})
    assert "unknown temperature" in error({"path": str(rm_dir), "temperature": 1.0})
    assert "allowed: path, batch_size" in error({"path": str(rm_dir), "temperature": 1.0})
    assert "no such folder" in error({"path": str(tmp_path / "missing")})
    assert "batch_size=0: must be a positive integer" in error({"path": str(rm_dir), "batch_size": 0})
    causal = error({"path": str(tiny_model_dir)})
    assert "Qwen2ForCausalLM, not a reward model" in causal and "oxrl train sl --alg rm" in causal
    assert "not a Hugging Face model folder" in error({"path": str(tmp_path)})
    two_labels = save_classifier(tmp_path / "two", tiny_model_dir, num_labels=2)
    assert "a classifier with 2 labels; a reward model has one" in error({"path": str(two_labels)})
    no_pad = save_classifier(tmp_path / "no-pad", tiny_model_dir, pad_token_id=None)
    assert "no pad_token_id" in error({"path": str(no_pad)})
    no_template = save_classifier(tmp_path / "no-template", tiny_model_dir, chat_template=False)
    assert "its tokenizer has no chat template" in error({"path": str(no_template)})


SCORED = ["<answer>1</answer>", "hm", "<answer>2</answer>"]


def test_a_batch_reward_is_called_once_for_all_samples():
    class CountingReward:
        def __init__(self):
            self.calls = []

        def score_batch(self, responses, samples):
            self.calls.append((responses, samples))
            return [float(len(r)) for r in responses]

        def __call__(self, response, sample):
            raise AssertionError("scored one sample at a time")

    reward = CountingReward()
    samples = SAMPLES[:1] * 3
    assert score_samples(reward, SCORED, samples, on_error=-7.0) == ([float(len(r)) for r in SCORED], [])
    assert reward.calls == [(SCORED, samples)]


def test_a_failing_batch_reward_gives_every_sample_on_error_and_one_error():
    class FailingReward:
        def score_batch(self, responses, samples):
            raise RuntimeError("reward model out of memory")

        def __call__(self, response, sample): ...

    rewards, errors = score_samples(FailingReward(), SCORED, SAMPLES[:1] * 3, on_error=-7.0)
    assert rewards == [-7.0] * 3
    [error] = errors
    assert (
        "reward model out of memory" in error["error"]
        and error["response"] == SCORED[0]
        and error["sample"] == SAMPLES[0]
    )


def test_a_plain_function_is_scored_per_sample_and_each_failure_reported():
    def reward(response, sample):
        if "answer" not in sample:
            raise KeyError("answer")
        return 1.0

    rewards, errors = score_samples(reward, SCORED[:2], [{"answer": "1"}, {}], on_error=-7.0)
    assert rewards == [1.0, -7.0]
    assert errors == [{"error": "KeyError('answer')", "response": "hm", "sample": {}}]
