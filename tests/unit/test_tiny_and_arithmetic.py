"""The built-in tiny model and the synthetic arithmetic task."""

import json
import re
from pathlib import Path

from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from oxrl_core.models.tiny import build_tiny_model
from oxrl_core.preprocess.arithmetic import arithmetic_problems, sft_records

REPO = Path(__file__).resolve().parents[2]


def test_tiny_model_has_the_shape_vllm_cpu_needs_and_a_chatml_tokenizer(tiny_model_dir):
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.hidden_size // config.num_attention_heads == 64 and config.num_key_value_heads == 1
    assert config.tie_word_embeddings
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tokenizer.eos_token == "<|im_end|>" and config.eos_token_id == tokenizer.eos_token_id
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_two_builds_are_identical(tmp_path, tiny_model_dir):
    other = build_tiny_model(tmp_path / "again")
    a, b = load_file(tiny_model_dir / "model.safetensors"), load_file(other / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert (tiny_model_dir / "tokenizer.json").read_text() == (other / "tokenizer.json").read_text()


def test_arithmetic_is_seeded_and_correct():
    problems = arithmetic_problems(200, seed=7)
    assert problems == arithmetic_problems(200, seed=7) and problems != arithmetic_problems(200, seed=8)
    for p in problems:
        a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", p["prompt"]).groups()
        assert int(p["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))


def test_shipped_example_data_is_the_generators_output():
    for name, n, seed in (("train", 512, 0), ("val", 64, 1)):
        shipped = (REPO / "examples" / "data" / f"arithmetic_sft_{name}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in shipped] == sft_records(arithmetic_problems(n, seed=seed))
