"""Verifiable rewards on final answers: math (boxed or <answer>), GSM8K (final number), format."""

import re

from math_verify import parse, verify

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.S)


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
            return text[i + 1:j].strip()
    return None  # unbalanced braces: malformed


def answers_equal(predicted: str, truth: str) -> bool:
    """Mathematical equivalence (math-verify: LaTeX, fractions, percentages, sets, ...), else exact text."""
    if predicted.strip() == truth.strip():
        return True
    gold, guess = parse(f"${truth}$"), parse(f"${predicted}$")  # math-verify bounds each with a timeout
    return bool(gold and guess and verify(gold, guess))


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
