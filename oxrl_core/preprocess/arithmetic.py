"""The seeded synthetic arithmetic task of the demo and the tests.

"What is 17 + 25?" -> "<answer>42</answer>": small enough for the tiny model to
learn the format by SFT and to improve on with a verifiable reward.
"""

import json
import random
from pathlib import Path


def arithmetic_problems(n: int, seed: int, max_operand: int = 50) -> list[dict]:
    """`n` problems `{"prompt", "answer"}` with + and - on operands 0..max_operand, the same for the same seed.

    Differences may be negative.
    """
    rng = random.Random(seed)
    problems = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        problems.append(_problem(a, rng.choice("+-"), b))
    return problems


def every_arithmetic_problem(max_operand: int) -> list[dict]:
    """Each distinct problem on operands 0..max_operand once: (max_operand + 1)^2 sums and as many differences."""
    return [_problem(a, op, b) for a in range(max_operand + 1) for b in range(max_operand + 1) for op in "+-"]


def _problem(a: int, op: str, b: int) -> dict:
    return {"prompt": f"What is {a} {op} {b}?", "answer": str(a + b if op == "+" else a - b)}


def sft_records(problems: list[dict]) -> list[dict]:
    """Prompt-completion SFT records whose completion is the answer in the demo's `<answer>` format."""
    return [{"prompt": p["prompt"], "completion": f"<answer>{p['answer']}</answer>"} for p in problems]


def off_by_one_sft_records(problems: list[dict], share: float, rng: random.Random) -> list[dict]:
    """`sft_records` whose answer is one too high in about `share` of them, drawn independently per record:
    demonstrations a verifier would catch and imitation cannot."""
    return [
        {"prompt": p["prompt"], "completion": f"<answer>{int(p['answer']) + (rng.random() < share)}</answer>"}
        for p in problems
    ]


def write_jsonl(records: list[dict], path: Path) -> Path:
    """One JSON object per line; parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _wrong_answer(answer: str, rng: random.Random) -> str:
    return str(int(answer) + rng.choice([-1, 1]) * rng.randint(1, 9))


def preference_records(problems: list[dict], seed: int) -> list[dict]:
    """prompt/chosen/rejected: the right answer in the `<answer>` format over a wrong number in plain words,
    so a preference is easy to learn (a separable set for DPO-style methods and reward models)."""
    rng = random.Random(seed)
    return [
        {
            "prompt": p["prompt"],
            "chosen": f"<answer>{p['answer']}</answer>",
            "rejected": f"I think it is {_wrong_answer(p['answer'], rng)}.",
        }
        for p in problems
    ]


def unpaired_records(problems: list[dict], seed: int) -> list[dict]:
    """KTO's prompt/completion/label: half desirable (the preference set's chosen answer), half not (its rejected)."""
    rng = random.Random(seed)
    records = []
    for pair in preference_records(problems, seed):
        desirable = rng.random() < 0.5
        records.append(
            {"prompt": pair["prompt"], "completion": pair["chosen" if desirable else "rejected"], "label": desirable}
        )
    return records


def text_records(problems: list[dict]) -> list[dict]:
    """Raw text for continued pre-training: each problem stated with its answer."""
    return [{"text": f"{p['prompt']} The answer is {p['answer']}."} for p in problems]
