"""RL prompt records: the chat template's generation prompt, and the reasons a prompt is skipped."""

import json

import pytest
from transformers import AutoTokenizer

from oxrl_core.data.records import load_prompts


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_prompts_end_with_the_generation_prompt_and_bad_ones_say_why(tmp_path, tokenizer):
    path = tmp_path / "p.jsonl"
    records = [
        {"prompt": "What is 2 + 3?", "answer": "5"},
        {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5"},
        {"answer": "5"},
        {"prompt": []},
        {"prompt": [{"role": "robot", "content": "x"}]},
        {"prompt": "word " * 40},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    prompts, report = load_prompts(path, tokenizer, max_prompt_len=32, strict=False)
    assert (
        tokenizer.decode(prompts[0].prompt_ids) == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompts[0].prompt_ids == prompts[1].prompt_ids and prompts[0].record == records[0]
    reasons = {p.line: p.reason for p in report.problems}
    assert reasons.keys() == {3, 4, 5, 6} and report.kept == 2
    assert reasons[3].startswith("missing field 'prompt'") and reasons[4] == "field 'prompt' is an empty list"
    assert reasons[5].startswith(
        "message 0 must be {role: one of system, user, assistant, tool, content: string or list of parts}"
    )
    assert reasons[6].startswith("prompt is ") and reasons[6].endswith("tokens; rollout.max_prompt_len is 32")


def test_an_episodes_opening_is_its_environments_with_the_tools_and_records_it_cannot_open_say_why(
    tmp_path, tokenizer, tiny_vl_model_dir
):
    from PIL import Image

    from oxrl_core.envs.calculator import Calculator
    from oxrl_core.envs.guess_number import GuessNumber

    Image.new("RGB", (32, 32)).save(tmp_path / "x.png")
    path = tmp_path / "p.jsonl"
    records = [
        {"prompt": "What is 2 + 3?", "answer": "5"},
        {"prompt": "Guess.", "answer": "many"},
        {
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}],
            "images": ["x.png"],
            "answer": "1",
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    prompts, _ = load_prompts(path, tokenizer, max_prompt_len=256, strict=False, new_env=Calculator)
    text = tokenizer.decode(prompts[0].prompt_ids)
    assert text.startswith("<|im_start|>system\nTools") and "mul(a, b): a * b\n" in text
    assert text.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    games, report = load_prompts(path, tokenizer, max_prompt_len=256, strict=False, new_env=GuessNumber)
    reasons = {p.line: p.reason for p in report.problems}
    assert [g.record["answer"] for g in games] == ["5"]
    assert reasons[2].startswith("field 'answer' must be the secret whole number")
    _, report = load_prompts(path, AutoTokenizer.from_pretrained(tiny_vl_model_dir), 256, False, new_env=Calculator)
    assert [p.line for p in report.problems] == [3] and "text-only" in report.problems[0].reason
