"""One converter per source format: a source record -> oxrl record(s), or ValueError(reason), which drops the record.

- gsm8k: GSM8K (Cobbe et al. 2021, arXiv 2110.14168; Hub `openai/gsm8k`, subset `main`):
  {question, answer: worked solution ending "#### 72"} -> {prompt, answer: "72"}, an RL
  record for the `gsm8k` reward.
- math: MATH (Hendrycks et al. 2021, arXiv 2103.03874): {problem, solution, level, type}
  -> {prompt, answer, level, type}, the answer being the last \\boxed{...} of the solution,
  an RL record for the `math` reward.
- openr1: OpenR1-Math-220k (Hub `open-r1/OpenR1-Math-220k`): problems of NuminaMath 1.5
  with several DeepSeek-R1 reasoning traces each. Read: problem, answer, generations
  (the traces), correctness_math_verify and correctness_llama (per trace: Math-Verify's
  verdict, and Llama-3.3-70B's where Math-Verify could not parse, else null) and
  is_reasoning_complete (per trace). One SFT record {prompt, completion, answer} per
  trace that either verdict marks correct and whose reasoning is complete.
- preference: TRL's preference formats (see oxrl_core/data/preference.py) ->
  {prompt, chosen, rejected} as conversations, the format preference training reads.
- generic: the record as it is, after the `--map` renames.
"""

import math


def gsm8k_record(record: dict) -> dict:
    """{question, answer "... #### 1,234"} -> {prompt, answer: "1234"}: the final number, commas removed."""
    from oxrl_core.rewards.math import (
        NUMBER,
    )  # here, not at the top: the rewards package imports transformers (seconds)

    question, solution = _text(record, "question"), _text(record, "answer")
    if "####" not in solution:
        raise ValueError("no '####' in field 'answer' (a GSM8K answer ends with '#### <final number>')")
    final = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not NUMBER.fullmatch(final):
        raise ValueError(f"the text after '####' is not a number: {final!r:.40}")
    return {"prompt": question, "answer": final}


def math_record(record: dict) -> dict:
    """{problem, solution with \\boxed{...}, level?, type?} -> {prompt, answer, level?, type?}."""
    from oxrl_core.rewards.math import extract_answer  # here: see gsm8k_record

    problem, solution = _text(record, "problem"), _text(record, "solution")
    answer = extract_answer(solution)
    if answer is None:
        raise ValueError("no complete \\boxed{...} in field 'solution' (MATH marks its final answer with \\boxed)")
    if not answer:
        raise ValueError("empty \\boxed{} in field 'solution'")
    return {
        "prompt": problem,
        "answer": answer,
        **{k: record[k] for k in ("level", "type") if record.get(k) is not None},
    }


def openr1_records(record: dict) -> list[dict]:
    """An OpenR1-Math row -> one {prompt, completion, answer} per verified-correct, complete trace."""
    problem, answer = _text(record, "problem"), _text(record, "answer")
    generations = record.get("generations")
    if not isinstance(generations, list) or not all(isinstance(g, str) for g in generations):
        raise ValueError(
            f"field 'generations' must be a list of strings (the reasoning traces), got {generations!r:.80}"
        )
    verified = _flags(record, "correctness_math_verify", len(generations), required=True)
    judged = _flags(record, "correctness_llama", len(generations), required=False)
    complete = _flags(record, "is_reasoning_complete", len(generations), required=False)
    kept = [
        {"prompt": problem, "completion": generation, "answer": answer}
        for i, generation in enumerate(generations)
        if (verified[i] or (judged is not None and judged[i]))
        and (complete is None or complete[i])
        and generation.strip()
    ]
    if not kept:
        raise ValueError(
            f"none of the {len(generations)} generations is both verified correct "
            "(correctness_math_verify or correctness_llama) and complete (is_reasoning_complete)"
        )
    return kept


def preference_record(record: dict) -> dict:
    """A preference record in any of TRL's shapes -> {prompt, chosen, rejected} as lists of {role, content}.

    A string prompt with string (or assistant-message) completions, or two whole
    conversations whose shared leading messages are the prompt; whole conversations
    win over a `prompt` field next to them (UltraFeedback-binarized keeps both).
    An optional `margin` (a finite number) is kept.
    """
    from oxrl_core.data.preference import _completion_turns, _prompt_turns, _split_shared_prompt

    for name in ("chosen", "rejected"):
        if record.get(name) is None:
            raise ValueError(
                f"missing field {name!r} (a preference record needs 'chosen' and 'rejected')"
                f"{_fields_hint(record, name)}"
            )
    chosen, rejected = record["chosen"], record["rejected"]
    if record.get("prompt") is None or (_is_conversation(chosen) and _is_conversation(rejected)):
        prompt, chosen, rejected = _split_shared_prompt(chosen, rejected)
    else:
        prompt, chosen, rejected = (
            _prompt_turns(record["prompt"]),
            _completion_turns(chosen, "chosen"),
            _completion_turns(rejected, "rejected"),
        )
    pair = {"prompt": _role_content(prompt), "chosen": _role_content(chosen), "rejected": _role_content(rejected)}
    margin = record.get("margin")
    if margin is not None:
        if isinstance(margin, bool) or not isinstance(margin, int | float) or not math.isfinite(margin):
            raise ValueError(f"field 'margin' must be a finite number, got {margin!r:.80}")
        pair["margin"] = float(margin)
    return pair


def generic_record(record: dict) -> dict:
    """The record unchanged: `--map` has already renamed its columns."""
    return dict(record)


CONVERTERS = {
    "gsm8k": gsm8k_record,
    "math": math_record,
    "openr1": openr1_records,
    "preference": preference_record,
    "generic": generic_record,
}


def _text(record: dict, name: str) -> str:
    value = record.get(name)
    if value is None:
        raise ValueError(f"missing field {name!r}{_fields_hint(record, name)}")
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"empty field {name!r}")
    return value


def _fields_hint(record: dict, name: str) -> str:
    """The fields a record has, so a differently named column is one `--map` away."""
    present = ", ".join(k for k, v in record.items() if v is not None) or "none"
    return f"; the row's fields: {present}; rename one with --map {name}=COLUMN"


def _flags(record: dict, name: str, n: int, required: bool) -> list[bool] | None:
    """A per-generation list of booleans (a null entry counts as false); None when absent and not required."""
    flags = record.get(name)
    if flags is None and not required:
        return None
    if not isinstance(flags, list) or not all(f is None or isinstance(f, bool) for f in flags):
        raise ValueError(f"field {name!r} must be a list of booleans, one per generation, got {flags!r:.80}")
    if len(flags) != n:
        raise ValueError(f"field {name!r} has {len(flags)} entries for {n} generations")
    return [f is True for f in flags]


def _is_conversation(value) -> bool:
    """A whole conversation: a list of messages that starts before the assistant's turn."""
    return (
        isinstance(value, list) and bool(value) and isinstance(value[0], dict) and value[0].get("role") != "assistant"
    )


def _role_content(messages: list[dict]) -> list[dict]:
    """Messages as {role, content} only, so every row of the output has the same parquet type."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]
