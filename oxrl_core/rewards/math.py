"""Verifiable rewards on final answers: math (boxed or <answer>), GSM8K (final number), format."""

import re
import threading

from math_verify import parse, verify

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.S)
MATH_VERIFY_TIMEOUT_S = 5  # math-verify's own default, for each parse and the comparison
MAX_ANSWER_CHARS = 1000  # off the main thread math-verify runs unbounded: no real answer is longer


def extract_answer(text: str) -> str | None:
    """The last `<answer>...</answer>`, else the last `\\boxed{...}` (nested braces allowed), else None."""
    tags = ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
    return None  # unbalanced braces: malformed


def answers_equal(predicted: str, truth: str) -> bool:
    """Mathematical equivalence (math-verify: LaTeX, fractions, percentages, sets, ...), else exact text."""
    if predicted.strip() == truth.strip():
        return True
    # math-verify's timeouts are signal alarms, which only the main thread may set: on a reward worker's thread (or
    # a pipelined run's sampling thread) it runs without them, on answers of bounded length
    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    if timeout is None and max(len(predicted), len(truth)) > MAX_ANSWER_CHARS:
        return False
    gold, guess = parse(f"${truth}$", parsing_timeout=timeout), parse(f"${predicted}$", parsing_timeout=timeout)
    return bool(gold and guess and verify(gold, guess, timeout_seconds=timeout))


def math_reward(response: str, sample: dict) -> float:
    """1 when the extracted answer equals `sample["answer"]`, else 0 (also when there is none)."""
    predicted = extract_answer(response)
    return float(predicted is not None and answers_equal(predicted, str(sample["answer"])))


def gsm8k_reward(response: str, sample: dict) -> float:
    """GSM8K: the last number of the response (after `####` if present) equals the final number of the answer."""
    truth = str(sample["answer"]).split("####")[-1]
    tail = response.split("####")[-1] if "####" in response else (extract_answer(response) or response)
    predicted, expected = NUMBER.findall(tail), NUMBER.findall(truth)
    if not predicted or not expected:
        return 0.0
    return float(_number(predicted[-1]) == _number(expected[-1]))


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def format_reward(response: str, sample: dict) -> float:
    """1 for exactly `<think>...</think><answer>...</answer>`, else 0."""
    return float(bool(THINK_ANSWER.match(response)))
