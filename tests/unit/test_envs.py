"""Multi-turn RL: the tool-call parser, the shipped environments, the turn template, episodes (turns, budget,
truncation) and the token mask that keeps environment tokens out of the loss and out of the logprob gap."""

import json

import pytest
import torch

from oxrl_core.algs.cispo import cispo_loss
from oxrl_core.config.schema import RLTrain
from oxrl_core.data.records import PromptExample
from oxrl_core.envs import resolve_env
from oxrl_core.envs.base import EnvStep
from oxrl_core.envs.calculator import Calculator
from oxrl_core.envs.guess_number import GuessNumber
from oxrl_core.envs.tool_calls import MAX_CALLS, MAX_RESULT_CHARS, BadCall, ToolCall, parse_tool_calls, run_tool_calls
from oxrl_core.errors import OxrlError
from oxrl_core.loops.recipes.policy_gradient import correct, rl_micro_batches
from oxrl_core.rollout.episodes import TurnTemplate, stream_episodes
from oxrl_core.rollout.records import Completion, Rollout, sample_seed


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# -- the parser ------------------------------------------------------------------------------------------------


def test_tool_calls_are_read_in_order_and_text_without_one_has_none():
    text = "Let me add. " + call("add", a=2, b=3) + "\n" + call("mul", a=4, b=5.5)
    assert parse_tool_calls(text) == [ToolCall("add", {"a": 2, "b": 3}), ToolCall("mul", {"a": 4, "b": 5.5})]
    assert parse_tool_calls("The answer is 5.") == []


@pytest.mark.parametrize(
    "text, error",
    [
        ("<tool_call>{not json}</tool_call>", "not JSON"),
        ('<tool_call>["add", 1, 2]</tool_call>', 'expected {"name"'),
        ('<tool_call>{"arguments": {}}</tool_call>', 'expected {"name"'),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "arguments must be an object"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}', "without its </tool_call>"),
    ],
)
def test_a_malformed_call_is_a_bad_call_saying_why(text, error):
    [bad] = parse_tool_calls(text)
    assert isinstance(bad, BadCall) and error in bad.error


def test_hostile_calls_cost_no_more_than_reading_them():
    assert "at most" in parse_tool_calls(call("add", a=1, b=2) * (MAX_CALLS + 1))[0].error
    [deep] = parse_tool_calls("<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>")
    assert isinstance(deep, BadCall)  # too long to parse, never a RecursionError
    [deep] = parse_tool_calls("<tool_call>" + "[" * 900 + "]" * 900 + "</tool_call>")
    assert isinstance(deep, BadCall)
    replies = run_tool_calls(
        parse_tool_calls(
            call("mul", a=1e12, b=1e12)
            + call("div", a=1, b=0)
            + call("add", a="1", b=2)
            + call("__import__", module="os")
            + call("add", a=1, b=2, c=3)
        ),
        Calculator.FUNCTIONS,
    )
    contents = [r["content"] for r in replies]
    assert all(r["role"] == "tool" for r in replies)
    assert "beyond" in contents[0] and "ZeroDivisionError" in contents[1] and "operands are numbers" in contents[2]
    assert "unknown tool '__import__'" in contents[3] and "TypeError" in contents[4]
    long_result = run_tool_calls([ToolCall("echo", {})], {"echo": lambda: "x" * 10_000})
    assert len(long_result[0]["content"]) == MAX_RESULT_CHARS


# -- the environments ------------------------------------------------------------------------------------------


def test_the_calculator_answers_tool_calls_and_ends_at_a_message_without_one():
    env = Calculator()
    assert env.reset({"prompt": "What is 12 * 3?", "answer": "36"}) == [{"role": "user", "content": "What is 12 * 3?"}]
    assert env.step(call("mul", a=12, b=3)).messages == [{"role": "tool", "content": "36"}]
    assert env.step(call("div", a=1, b=4)).messages == [{"role": "tool", "content": "0.25"}]
    assert env.step("<tool_call>oops</tool_call>").messages[0]["content"].startswith("error: not JSON")
    assert env.step("The answer is 36.") == EnvStep(done=True)  # reward.func scores the answer


def test_guess_the_number_says_higher_or_lower_and_rewards_the_found_number():
    env = GuessNumber()
    env.reset({"prompt": "Guess my number from 1 to 100.", "answer": "37"})
    assert env.step("50").messages == [{"role": "user", "content": "lower"}]
    assert env.step("I guess 25").messages == [{"role": "user", "content": "higher"}]
    assert env.step("no idea").messages[0]["content"] == "Answer with one whole number."
    assert env.step("9" * 5000).messages == [{"role": "user", "content": "lower"}]  # read in pieces, not parsed whole
    assert env.step("It is 37") == EnvStep(done=True, reward=1.0)
    with pytest.raises(ValueError, match="secret whole number"):
        GuessNumber().reset({"prompt": "Guess.", "answer": "thirty"})


def test_environments_resolve_by_name_or_module_and_bad_ones_are_named():
    assert resolve_env("calculator", {}) is Calculator
    assert resolve_env("oxrl_core.envs.guess_number:GuessNumber", {}) is GuessNumber
    with pytest.raises(OxrlError, match="not a shipped environment"):
        resolve_env("chess", {})
    with pytest.raises(OxrlError, match="cannot import"):
        resolve_env("no_such_module:Env", {})
    with pytest.raises(OxrlError, match="rollout.env.kwargs"):
        resolve_env("calculator", {"depth": 3})


# -- the turn template -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from oxrl_core.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny") / "oxrl-tiny"))


def test_the_environments_reply_follows_the_sampled_end_of_turn_up_to_the_next_generation_prompt(tokenizer):
    template = TurnTemplate(tokenizer, Calculator.tools)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    reply = template.reply_ids([{"role": "tool", "content": "36"}], last_sampled=im_end)
    assert tokenizer.decode(reply) == "\n<|im_start|>tool\n36<|im_end|>\n<|im_start|>assistant\n"
    # a message that stopped on another token keeps the template's whole closing
    other = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert (
        tokenizer.decode(template.reply_ids([{"role": "user", "content": "higher"}], last_sampled=other))
        == "<|im_end|>\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer):
    class Rewriting:  # renders the assistant's message only while it is the last one
        def apply_chat_template(self, messages, tools, tokenize, add_generation_prompt):
            return "".join(
                m["content"] if m["role"] != "assistant" or m is messages[-1] else "(earlier)" for m in messages
            )

        def decode(self, ids):
            return ""

    with pytest.raises(OxrlError, match="renders an assistant message differently"):
        TurnTemplate(Rewriting(), []).reply_ids([{"role": "user", "content": "higher"}], last_sampled=0)


# -- episodes --------------------------------------------------------------------------------------------------

END = 2  # <|im_end|> of the tiny tokenizer


class ScriptedPolicy:
    """A stand-in for the pool's stream, an engine that samples every request at once at one token a step: episode
    k's t-th message is `messages[k][t]` (logprob -0.5 per token, policy version 3 unless `versions[t]`). A finished
    request's follow-up starts the step it ends. Records each request and the step each finished."""

    def __init__(self, tokenizer, messages: list[list[str]], versions: list[int] | None = None):
        self.tokenizer, self.messages, self.versions, self.requests, self.ended = tokenizer, messages, versions, [], []

    def __call__(self, requests, groups, follow_up):
        running, turns = [], {}

        def start(request, now):
            self.requests.append(request)
            t = turns[request.key] = turns.get(request.key, -1) + 1
            ids = self.tokenizer(self.messages[request.key][t], add_special_tokens=False)["input_ids"] + [END]
            running.append((now + min(len(ids), request.max_tokens), len(self.requests), request, ids, t))

        for request in requests:
            start(request, 0)
        while running:
            running.sort(key=lambda x: x[:2])
            now, _, request, ids, t = running.pop(0)
            finish = "length" if len(ids) > request.max_tokens else "stop"
            ids = ids[: request.max_tokens]
            done = Completion(
                request.key, ids, [-0.5] * len(ids), finish, [(self.versions[t] if self.versions else 3, 0)]
            )
            self.ended.append((request.key, t, now))
            following = follow_up(done)
            for nxt in following:
                start(nxt, now)
            if not following:
                yield done


def episodes(tokenizer, policy, env=Calculator, n=1, max_turns=4, max_tokens=64, max_episode_tokens=400, records=None):
    records = records or [{"prompt": "What is 12 * 3?", "answer": "36"}]
    template = TurnTemplate(tokenizer, env.tools)
    prompts = [
        PromptExample(
            tokenizer.apply_chat_template(
                env().reset(r), tools=env.tools or None, add_generation_prompt=True, return_dict=False
            ),
            r,
        )
        for r in records
    ]
    ended = stream_episodes(policy, prompts, n, 1.0, 1.0, 7, env, template, max_turns, max_tokens, max_episode_tokens)
    return [rollout for _, rollout in sorted(ended, key=lambda x: x[0])], prompts


def test_an_episode_holds_the_policys_turns_and_the_environments_replies_masked(tokenizer):
    policy = ScriptedPolicy(tokenizer, [[call("mul", a=12, b=3), "The answer is 36."]])
    [episode], [prompt] = episodes(tokenizer, policy)
    first = tokenizer(call("mul", a=12, b=3), add_special_tokens=False)["input_ids"] + [END]
    reply = tokenizer("\n<|im_start|>tool\n36<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)[
        "input_ids"
    ]
    last = tokenizer("The answer is 36.", add_special_tokens=False)["input_ids"] + [END]
    assert episode.response_ids == first + reply + last
    assert episode.policy_mask == [1] * len(first) + [0] * len(reply) + [1] * len(last)
    assert episode.sampler_logprobs == [-0.5] * len(first) + [0.0] * len(reply) + [-0.5] * len(last)
    assert tokenizer.decode(episode.answer_ids, skip_special_tokens=True) == "The answer is 36."
    assert episode.finish_reason == "stop" and episode.env_reward is None and episode.policy_version == 3
    # turn 2 continued the same context (vLLM reuses its cached prefix); each turn has its own seed
    assert policy.requests[1].prompt_ids == prompt.prompt_ids + first + reply
    assert [r.seed for r in policy.requests] == [sample_seed(7 * 16, 0, 1, 0), sample_seed(7 * 16 + 1, 0, 1, 0)]


def test_max_turns_cuts_an_episode_after_its_last_allowed_message_with_no_environment_reward(tokenizer):
    policy = ScriptedPolicy(tokenizer, [["10", "20"]])
    [episode], _ = episodes(
        tokenizer, policy, env=GuessNumber, max_turns=2, records=[{"prompt": "Guess from 1 to 100.", "answer": "37"}]
    )
    assert len(policy.requests) == 2 and episode.finish_reason == "stop" and episode.env_reward is None
    assert tokenizer.decode(episode.response_ids).endswith("20<|im_end|>")  # no reply after the last allowed turn


def test_an_episodes_next_turn_starts_when_its_message_ends_not_after_the_other_episodes(tokenizer):
    records = [{"prompt": "Guess.", "answer": "37"}, {"prompt": "Guess.", "answer": "5"}]
    policy = ScriptedPolicy(tokenizer, [["9", "37"], ["I am thinking it over for a long while, then: 5"]])
    found_first, found_second = episodes(tokenizer, policy, env=GuessNumber, records=records)[0]
    assert found_first.env_reward == 1.0 and found_second.env_reward == 1.0
    # episode 0 took its second turn and ended while episode 1's first message was still being sampled
    assert [(key, turn) for key, turn, _ in policy.ended] == [(0, 0), (0, 1), (1, 0)]
    assert sum(found_second.policy_mask) == len(found_second.response_ids)  # one turn: nothing masked


def test_the_token_budget_shrinks_each_turn_and_an_episode_reaching_it_ends_truncated(tokenizer):
    first = call("mul", a=12, b=3)
    used = len(tokenizer(first, add_special_tokens=False)["input_ids"]) + 1
    reply = len(
        tokenizer("\n<|im_start|>tool\n36<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    )
    # room for the first message and the reply, then 3 tokens of the second
    policy = ScriptedPolicy(tokenizer, [[first, "The answer is 36."]])
    [episode], _ = episodes(tokenizer, policy, max_tokens=64, max_episode_tokens=used + reply + 3)
    assert policy.requests[1].max_tokens == 3 and episode.finish_reason == "length"
    assert len(episode.response_ids) == used + reply + 3
    # no room left after the reply: the episode ends at the policy's message, truncated
    policy = ScriptedPolicy(tokenizer, [[first]])
    [episode], _ = episodes(tokenizer, policy, max_tokens=64, max_episode_tokens=used + reply)
    assert len(policy.requests) == 1 and episode.finish_reason == "length" and len(episode.response_ids) == used
    # a message cut by rollout.max_tokens ends its episode truncated, unanswered
    policy = ScriptedPolicy(tokenizer, [[first]])
    [episode], _ = episodes(tokenizer, policy, max_tokens=5)
    assert len(policy.requests) == 1 and episode.finish_reason == "length" and len(episode.response_ids) == 5


def test_the_oldest_policy_version_of_an_episodes_turns_is_its_version(tokenizer):
    [episode], _ = episodes(tokenizer, ScriptedPolicy(tokenizer, [[call("add", a=1, b=2), "3"]], versions=[3, 2]))
    assert episode.policy_version == 2


def test_an_episode_records_where_the_weights_changed_between_its_turns(tokenizer):
    """An asynchronous run's refresh between two turns: the second turn's first token starts the new version (as a
    refresh within one sample does), and an episode sampled under one version records nothing."""
    [changed], _ = episodes(tokenizer, ScriptedPolicy(tokenizer, [[call("add", a=1, b=2), "3"]], versions=[3, 4]))
    second_turn = changed.policy_mask.index(1, changed.policy_mask.index(0))  # the first policy token after a reply
    assert changed.version_starts == ((3, 0), (4, second_turn)) and changed.policy_version == 3
    [same], _ = episodes(tokenizer, ScriptedPolicy(tokenizer, [[call("add", a=1, b=2), "3"]], versions=[3, 3]))
    assert same.version_starts == ()


# -- the token mask --------------------------------------------------------------------------------------------


def episode_rollouts() -> list[Rollout]:
    """Two episodes: prompt, policy tokens, environment tokens, policy tokens; and a single-turn sample."""
    return [
        Rollout(
            0,
            [5, 6, 7],
            [10, 11, 20, 21, 22, 12],
            [-1.0, -1.0, 0.0, 0.0, 0.0, -1.0],
            "stop",
            0,
            policy_mask=[1, 1, 0, 0, 0, 1],
        ),
        Rollout(0, [5, 6, 7], [13, 2], [-1.0, -1.0], "stop", 0),
    ]


def test_environment_tokens_are_masked_out_of_the_loss_and_get_no_gradient():
    per_rank = rl_micro_batches(episode_rollouts(), {"advantages": torch.tensor([1.0, -1.0])}, 1, 2, 0, False)
    batch = per_rank[0][0]
    # prediction-aligned: position t predicts token t + 1; the prompt is 3 tokens
    assert batch["response_mask"][0].tolist() == [0, 0, 1, 1, 0, 0, 0, 1]
    assert batch["response_mask"][1].tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
    logprobs = torch.full_like(batch["response_mask"], -1.0, dtype=torch.float64, requires_grad=True)
    loss, _ = cispo_loss(
        logprobs,
        logprobs.detach(),
        batch["advantages"].double(),
        batch["response_mask"].double(),
        torch.ones_like(logprobs),
        clip_low=0.2,
        clip_high=0.28,
        loss_agg="token-mean",
        num_tokens=batch["response_mask"].sum().item(),
        num_seqs=2.0,
        max_tokens=8.0,
    )
    loss.backward()
    env_positions = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 0], [0] * 8], dtype=torch.bool)
    assert (logprobs.grad[env_positions] == 0).all() and (logprobs.grad[batch["response_mask"] > 0] != 0).all()


def test_the_logprob_gap_counts_policy_tokens_only():
    per_rank = rl_micro_batches(episode_rollouts(), {"advantages": torch.tensor([1.0, -1.0])}, 1, 2, 0, False)
    batch = per_rank[0][0]
    batch["old_logprobs"] = batch["sampler_logprobs"].clone()
    batch["old_logprobs"][0, 4:7] = -30.0  # the environment's tokens: anything at all under the trainer
    gap = correct([batch], RLTrain().settings)
    assert gap["logprob_gap_abs"] == 0.0 and gap["logprob_gap_kl"] == 0.0 and gap["is_ratio_max"] == 1.0


def test_a_truncated_episode_is_left_out_whole_when_truncated_samples_are_masked():
    [episode, _] = episode_rollouts()
    episode.finish_reason = "length"
    batch = rl_micro_batches([episode], {"advantages": torch.tensor([1.0])}, 1, 1, 0, mask_truncated=True)[0][0]
    assert batch["response_mask"].sum() == 0
