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
    records = [{"prompt": "What is 2 + 3?", "answer": "5"},
               {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5"},
               {"answer": "5"}, {"prompt": []}, {"prompt": [{"role": "robot", "content": "x"}]}, {"prompt": "word " * 40}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    prompts, report = load_prompts(path, tokenizer, max_prompt_len=32, strict=False)
    assert tokenizer.decode(prompts[0].prompt_ids) == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert prompts[0].prompt_ids == prompts[1].prompt_ids and prompts[0].record == records[0]
    reasons = {p.line: p.reason for p in report.problems}
    assert reasons.keys() == {3, 4, 5, 6} and report.kept == 2
    assert reasons[3].startswith("missing field 'prompt'") and reasons[4] == "field 'prompt' is an empty list"
    assert reasons[5].startswith("message 0 must be {role: one of system, user, assistant, tool, content: string or list of parts}")
    assert reasons[6].startswith("prompt is ") and reasons[6].endswith("tokens; rollout.max_prompt_len is 32")
