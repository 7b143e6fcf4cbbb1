"""Verifiable rewards: answer matching, GSM8K numbers, format, and the code sandbox's limits."""

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from oxrl_core.errors import OxrlError
from oxrl_core.rewards import resolve_reward, score_samples
from oxrl_core.rewards.code import code_reward, run_sandboxed
from oxrl_core.rewards.math import extract_answer, format_reward, gsm8k_reward, math_reward

MATH_CASES = [
    # equivalent forms
    ("<answer>42</answer>", "42", 1.0),
    ("so the result is <answer> 42 </answer>", "42", 1.0),
    ("The answer is $\\boxed{42}$.", "42", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("<answer>0.5</answer>", "\\frac{1}{2}", 1.0),
    ("<answer>1/2</answer>", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "0.75", 1.0),
    ("<answer>-3.0</answer>", "-3", 1.0),
    ("<answer>1,000</answer>", "1000", 1.0),
    ("\\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\sqrt{2}/2", 1.0),
    ("<answer>50\\%</answer>", "0.5", 1.0),
    ("\\boxed{(1, 2)}", "(1,2)", 1.0),
    ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}", 1.0),
    ("first \\boxed{3} then corrected \\boxed{4}", "4", 1.0),
    ("<answer>7</answer> and later <answer>8</answer>", "8", 1.0),
    ("\\boxed{\\frac{a}{b}}", "\\frac{a}{b}", 1.0),
    ("<answer>2x</answer>", "2x", 1.0),
    # wrong answers
    ("<answer>41</answer>", "42", 0.0),
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("<answer>-42</answer>", "42", 0.0),
    ("\\boxed{x^2+1}", "(x+1)^2", 0.0),
    ("<answer>2</answer>", "2x", 0.0),
    ("\\boxed{4} then \\boxed{3}", "4", 0.0),
    # malformed output
    ("42", "42", 0.0),  # no <answer> and no \boxed
    ("<answer>42", "42", 0.0),
    ("\\boxed{42", "42", 0.0),
    ("<answer></answer>", "42", 0.0),
    ("", "42", 0.0),
    ("\\boxed{}", "42", 0.0),
    ("<answer>forty-two</answer>", "42", 0.0),
    ("<ANSWER>42</ANSWER>", "42", 0.0),
]


@pytest.mark.parametrize("response, truth, expected", MATH_CASES)
def test_math_reward_matches_equivalent_answers_only(response, truth, expected):
    assert math_reward(response, {"answer": truth}) == expected


def test_math_reward_scores_every_case_the_same_on_reward_worker_threads():
    # math-verify's timeouts are signals, refused off the main thread: there it must run without them
    responses, samples = [r for r, _, _ in MATH_CASES], [{"answer": t} for _, t, _ in MATH_CASES]
    with ThreadPoolExecutor(4) as workers:
        rewards, errors = score_samples(math_reward, responses, samples, on_error=-1.0, workers=workers)
    assert errors == []
    assert rewards == [expected for _, _, expected in MATH_CASES]


def test_there_are_at_least_30_answer_matching_cases():
    assert len(MATH_CASES) >= 30


def test_boxed_extraction_handles_nested_braces():
    assert extract_answer("x \\boxed{\\frac{1}{\\sqrt{2}}} y") == "\\frac{1}{\\sqrt{2}}"


@pytest.mark.parametrize(
    "response, expected",
    [
        ("She has 1200 + 34 apples.\n#### 1234", 1.0),
        ("1234 first, then\n#### 7", 0.0),
        ("The total is 1,234 dollars.", 1.0),
        ("<answer>1234</answer>", 1.0),
        ("It costs 1234.0", 1.0),
        ("The answer is 1233.", 0.0),
        ("no number here", 0.0),
    ],
)
def test_gsm8k_reward_compares_final_numbers(response, expected):
    assert gsm8k_reward(response, {"answer": "Some steps... 1200 + 34 = 1234\n#### 1,234"}) == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>2 + 2 is 4</think><answer>4</answer>", 1.0),
        ("  <think>\nmulti\nline\n</think>\n<answer>4</answer>\n", 1.0),
        ("<answer>4</answer>", 0.0),
        ("<think>x</think>", 0.0),
        ("<think>x</think><answer>4</answer> trailing", 0.0),
    ],
)
def test_format_reward(response, expected):
    assert format_reward(response, {}) == expected


def test_code_reward_passes_correct_code_and_fails_wrong_code():
    tests = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
    assert code_reward("```python\ndef add(a, b):\n    return a + b\n```", tests) == 1.0
    assert code_reward("```python\ndef add(a, b):\n    return a - b\n```", tests) == 0.0
    assert code_reward("not code at all", tests) == 0.0


def test_code_sandbox_stops_an_infinite_loop_within_its_limit():
    start = time.monotonic()
    result = run_sandboxed("while True:\n    pass\n", timeout_s=1.0)
    assert not result.passed and result.reason == "timeout"
    assert time.monotonic() - start < 3.0


def test_code_sandbox_cannot_write_outside_its_directory(tmp_path):
    target = tmp_path / "escaped.txt"
    for attempt in (
        f"open({str(target)!r}, 'w').write('x')",
        f"import os; os.rename('inside.txt', {str(target)!r})",
        f"import pathlib; pathlib.Path({str(target)!r}).write_text('x')",
        f"import os; os.system('touch {target}')",
    ):
        result = run_sandboxed("open('inside.txt', 'w').write('ok')\n" + attempt)
        assert not result.passed and "sandbox" in result.output, attempt
        assert not target.exists()
    assert run_sandboxed("open('inside.txt', 'w').write('ok'); print(open('inside.txt').read())").passed


def test_code_sandbox_has_no_network_and_bounded_memory():
    assert not run_sandboxed("import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)").passed
    assert "MemoryError" in run_sandboxed("x = bytearray(2 * 1024**3)", memory_mb=256).output


def test_rewards_resolve_by_name_or_module_function():
    assert resolve_reward("math", {})("<answer>1</answer>", {"answer": "1"}) == 1.0
    assert resolve_reward("os.path:isabs", {}) is os.path.isabs
    with pytest.raises(OxrlError, match="not a shipped reward"):
        resolve_reward("nope", {})
    with pytest.raises(OxrlError, match="cannot import"):
        resolve_reward("no_such_module:f", {})
    assert resolve_reward("env", {}) is None  # an episode's environment scores it
    with pytest.raises(OxrlError, match="reward.kwargs: scale given for reward.func=env"):
        resolve_reward("env", {"scale": 2})


def test_a_reward_function_scores_as_many_samples_at_once_as_it_has_workers_and_keeps_each_score_with_its_sample():
    # each call waits until four are under way: only four threads at once get past it
    together = threading.Barrier(4, timeout=20)

    def waits_for_three_others(response, sample):
        together.wait()
        if sample["answer"] == "bad":
            raise ValueError("no answer")
        return float(len(response))

    responses, samples = (
        ["a", "bb", "ccc", "dddd"],
        [{"answer": "1"}, {"answer": "bad"}, {"answer": "3"}, {"answer": "4"}],
    )
    with ThreadPoolExecutor(4) as workers:
        rewards, errors = score_samples(waits_for_three_others, responses, samples, on_error=-1.0, workers=workers)
    assert rewards == [1.0, -1.0, 3.0, 4.0]
    assert [(e["response"], e["sample"]) for e in errors] == [("bb", {"answer": "bad"})]


def test_without_workers_a_reward_function_scores_the_samples_one_after_the_other_on_the_callers_thread():
    threads = []

    def records_its_thread(response, sample):
        threads.append(threading.current_thread())
        return 1.0

    assert score_samples(records_its_thread, ["a", "b", "c"], [{}] * 3, on_error=0.0) == ([1.0] * 3, [])
    assert threads == [threading.current_thread()] * 3
