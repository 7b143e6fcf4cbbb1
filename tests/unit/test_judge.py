"""The LLM judge reward (rewards/judge.py): its templates, how its verdicts are read, the pairwise order swap, what
an unreadable or unjudgeable sample scores, the bounded judgments log, and the config rules around it. The judge's
engine is replaced by a function from judge prompts to texts; tests/integration/test_rlaif.py runs the real one."""

import json
from pathlib import Path

import pytest

from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.cluster.placement import PlacementRequest, decide
from oxrl_core.config.schema import RLConfig
from oxrl_core.config.sections import JudgeSection
from oxrl_core.errors import OxrlError
from oxrl_core.resolve.checks import placement_request
from oxrl_core.resolve.run import resolve_run
from oxrl_core.rewards import resolve_reward, score_samples
from oxrl_core.rewards.base import RewardUnavailable, Unscored
from oxrl_core.rewards.judge import Judge, check_judge, pairwise_reward, parse_score, parse_verdict, prompt_text, render

QUESTION = {"prompt": "What is 2 + 3?", "answer": "5"}


@pytest.mark.parametrize(
    "text, reward",
    [
        ("Score: 8", 7 / 9),
        ("The answer is right.\nscore = 10", 1.0),
        ("**Score:** 1", 0.0),
        ("Score: 7/10", 6 / 9),  # the denominator is not a second score
        ("Score: 3 at first glance. On reflection, Score: 9", 8 / 9),  # the last verdict counts
        ("  6. ", 5 / 9),  # a reply that is only a number
        ("Score: 5.5", 4.5 / 9),
    ],
)
def test_a_score_is_read_from_the_last_score_line_and_scaled_to_0_1(text, reward):
    assert parse_score(text, 1, 10) == pytest.approx(reward)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I cannot evaluate this response.",  # a refusal
        "It deserves 7 out of 10, maybe 8.",  # several bare numbers, no Score line
        "Score: 11",  # out of range
        "Score: 0",
        "Score: high",
    ],
)
def test_a_judgment_without_a_readable_score_in_range_gives_none(text):
    assert parse_score(text, 1, 10) is None


@pytest.mark.parametrize(
    "text, verdict",
    [
        ("Verdict: A", "A"),
        ("A is clearer.\nverdict: b", "B"),
        ("[[B]]", "B"),
        ("A", "A"),
        ("Verdict: [[A]]", "A"),
        ("Verdict: A... no, Verdict: B", "B"),
        ("Both are fine.", None),
        ("", None),
        ("AB", None),
    ],
)
def test_a_pairwise_verdict_is_the_last_verdict_line_or_a_lone_letter(text, verdict):
    assert parse_verdict(text) == verdict


def test_pairwise_swaps_the_order_so_a_judge_biased_to_one_position_gives_no_signal():
    assert pairwise_reward("A", "A") == 0.5  # always the first answer: once for the response, once against it
    assert pairwise_reward("B", "B") == 0.5
    assert pairwise_reward("A", "B") == 1.0  # the response won in both orders
    assert pairwise_reward("B", "A") == 0.0
    assert pairwise_reward(None, "B") == 1.0  # an unreadable verdict counts out
    assert pairwise_reward(None, None) is None


def test_the_judge_reads_a_single_user_turn_as_is_and_a_conversation_as_role_lines():
    assert prompt_text({"prompt": "What is 2+2?"}) == "What is 2+2?"
    assert prompt_text({"messages": [{"role": "user", "content": "What is 2+2?"}]}) == "What is 2+2?"
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert prompt_text({"prompt": conversation}) == "system: Be brief.\nuser: 2+2?"
    assert prompt_text({"messages": conversation, "prompt": "ignored"}) == "system: Be brief.\nuser: 2+2?"


def test_templates_fill_their_placeholders_and_keep_other_braces():
    assert (
        render('Q: {prompt} {json: {"a": 1}} R: {response}', {"prompt": "2+3", "response": "{prompt}"})
        == 'Q: 2+3 {json: {"a": 1}} R: {prompt}'
    )  # a response that holds a placeholder is not filled in again
    number = check_judge(JudgeSection(model="m", score_min=0, score_max=5))
    assert "{prompt}" in number and "{response}" in number and "from 0 " in number and " to 5 " in number
    pairwise = check_judge(JudgeSection(model="m", score="pairwise"))
    assert "{first}" in pairwise and "{second}" in pairwise
    assert "Answer Yes or No." in check_judge(JudgeSection(model="m", score="yes-probability"))


@pytest.mark.parametrize(
    "settings, words",
    [
        (JudgeSection(), "reward.judge.model"),
        (JudgeSection(model="m", template="{prompt} {answer}"), "unknown placeholder(s) {answer}"),
        (JudgeSection(model="m", template="Question: {prompt}"), "must contain {response}"),
        (
            JudgeSection(model="m", score="pairwise", template="{prompt} {response}"),
            "unknown placeholder(s) {response}",
        ),
        (JudgeSection(model="m", score_min=5, score_max=5), "must be below reward.judge.score_max"),
    ],
)
def test_bad_judge_settings_are_refused_by_name(settings, words):
    with pytest.raises(
        OxrlError, match=words.replace("(", r"\(").replace(")", r"\)").replace("{", r"\{").replace("}", r"\}")
    ):
        check_judge(settings)


@pytest.fixture
def judge_of(tiny_model_dir):
    """`judge_of(verdict, **settings)`: a Judge on the tiny model's tokenizer whose engine is `verdict`, a function
    from one judge prompt to the judge's text."""

    def make(verdict, **settings) -> Judge:
        judge = Judge(JudgeSection(model=str(tiny_model_dir), **settings))
        judge._judge = lambda prompts: [(p, verdict(p)) for p in prompts]
        return judge

    return make


def test_number_scores_each_response_and_an_unreadable_judgment_scores_on_error(judge_of):
    judge = judge_of(lambda p: "Score: 10" if "Response:\n5" in p else "I will not rate this.")
    rewards, errors = score_samples(judge, ["5", "7"], [QUESTION, QUESTION], on_error=-1.0)
    assert rewards == [1.0, -1.0]
    assert len(errors) == 1 and errors[0]["response"] == "7" and "could not be read" in errors[0]["error"]
    assert "I will not rate this." in errors[0]["error"]


def test_number_fills_the_reference_answer_when_the_template_asks_for_it(judge_of):
    seen = []
    judge = judge_of(lambda p: seen.append(p) or "Score: 1", template="{prompt} | {response} | {reference}")
    judge.score_batch(["4"], [QUESTION])
    assert seen == ["What is 2 + 3? | 4 | 5"]


def test_pairwise_asks_twice_with_the_order_swapped_and_scores_the_share_of_wins(judge_of):
    def fair(prompt: str) -> str:  # the better answer wins wherever it stands: explained beats bare, 5 beats 4
        first, second = (prompt.split(f"Answer {x}:\n")[1].split("\n")[0] for x in "AB")
        rank = {"5 because 2 + 3 = 5": 2, "5": 1, "4": 0}
        return "Verdict: A" if rank[first] > rank[second] else "Verdict: B"

    judge = judge_of(fair, score="pairwise")  # against the reference answer, "5"
    assert judge.score_batch(["5 because 2 + 3 = 5", "4"], [QUESTION, QUESTION]) == [1.0, 0.0]
    biased = judge_of(lambda p: "Verdict: A", score="pairwise")
    assert biased.score_batch(["5", "4"], [QUESTION, QUESTION]) == [0.5, 0.5]
    with pytest.raises(OxrlError, match="needs an `answer`"):
        judge.score_batch(["5"], [{"prompt": "What is 2 + 3?"}])


def test_yes_probability_is_the_judges_yes_against_no_from_its_exact_logprobs(tiny_model_dir):
    import math

    judge = Judge(JudgeSection(model=str(tiny_model_dir), score="yes-probability"))
    asked = []

    def engine(method, prompt_ids, answers):  # the engine's continuation_logprobs: log p(Yes), log p(No) per prompt
        asked.append((method, len(prompt_ids), answers))
        return [[math.log(0.03), math.log(0.01)], [math.log(0.2), math.log(0.6)]]

    judge._call = engine
    assert judge.score_batch(["5", "4"], [QUESTION, QUESTION]) == [pytest.approx(0.75), pytest.approx(0.25)]
    tokenize = judge.tokenizer
    assert asked == [
        (
            "continuation_logprobs",
            2,
            [
                tokenize("Yes", add_special_tokens=False)["input_ids"],
                tokenize("No", add_special_tokens=False)["input_ids"],
            ],
        )
    ]


def test_a_judge_prompt_longer_than_the_judges_context_is_reported_not_sent(tiny_model_dir):
    judge = Judge(JudgeSection(model=str(tiny_model_dir), max_tokens=8, max_model_len=16))
    judge.engine = "never called: nothing fits"
    [scored] = judge.score_batch(["5"], [QUESTION])
    assert isinstance(scored, Unscored) and "exceeds reward.judge.max_model_len=16" in scored.reason


def test_a_dead_judge_ends_the_step_instead_of_scoring_on_error(judge_of):
    def dead(prompt):
        raise RewardUnavailable("reward.func=judge: the judge's vLLM engine died")

    with pytest.raises(RewardUnavailable, match="died"):
        score_samples(judge_of(dead), ["5"], [QUESTION], on_error=0.0)


def test_judgments_are_logged_until_the_size_bound_then_a_note(judge_of, tmp_path):
    judge = judge_of(lambda p: "Score: 5")
    judge.judgments, judge._log_budget = open(tmp_path / "judgments.jsonl", "w"), 1500
    for _ in range(10):
        judge.score_batch(["5"], [QUESTION])
    lines = [json.loads(line) for line in (tmp_path / "judgments.jsonl").read_text().splitlines()]
    assert 1 <= len(lines) - 1 < 10 and "log_max_mb" in lines[-1]["note"]
    assert lines[0]["reward"] == pytest.approx(4 / 9) and "What is 2 + 3?" in lines[0]["judge_prompt"]
    assert judge.score_batch(["5"], [QUESTION]) == [pytest.approx(4 / 9)]  # scoring goes on without the log


def rl_request(**reward) -> PlacementRequest:
    config = RLConfig.model_validate({"data": {"train": [{"path": "p.jsonl"}]}, "reward": reward})
    return placement_request(config, ALGORITHMS[config.train.alg])


def test_the_judge_gets_a_bundle_of_its_own_or_shares_trainer_rank_0s_gpu():
    assert decide(rl_request(func="judge"), 0).bundles == 3  # CPU: rank, engine, judge side by side
    own = decide(rl_request(func="judge"), 2)  # auto: rank and engine share one GPU, the judge has the other
    assert (own.mode, own.judge, own.bundles) == ("colocated", "own", 2)
    assert decide(rl_request(func="judge"), 3).mode == "split"
    assert decide(rl_request(func="judge", judge={"placement": "colocated"}), 1).bundles == 1
    with pytest.raises(OxrlError, match="plus one for reward.judge"):
        decide(rl_request(func="judge"), 1)  # trainer and engine fill the one GPU; the judge needs another
    assert decide(rl_request(func="math"), 0).judge is None


def test_judge_settings_with_another_reward_and_a_judge_outside_rl_are_refused(tmp_path):
    with pytest.raises(OxrlError, match="reward.judge: set, but reward.func='math'"):
        resolve_run(
            "rl", Path("examples/cispo_tiny.yaml"), ["reward.judge.model=oxrl-tiny", f"run.output_dir={tmp_path}"]
        )
    with pytest.raises(OxrlError, match="RL rollouts only"):
        resolve_reward("judge", {})
    with pytest.raises(OxrlError, match="settings are under reward.judge"):
        resolve_reward("judge", {"model": "x"}, JudgeSection(model="x"))
