"""The built-in tiny model: offline, the shape vLLM's CPU kernels need, ChatML, the same files from every build."""

import shutil

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from oxrl_core.errors import OxrlError
from oxrl_core.models import tiny
from oxrl_core.models.tiny import build_tiny_model


def test_loads_as_a_qwen2_causal_lm_with_head_dim_64(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = model.config
    assert config.model_type == "qwen2" and config.tie_word_embeddings and model.dtype == torch.float32
    assert model.model.layers[0].self_attn.head_dim == 64 and config.num_key_value_heads == 1
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert config.vocab_size == len(tokenizer)
    assert (config.eos_token_id, config.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    logits = model(torch.tensor([tokenizer("What is 2 + 3?")["input_ids"]])).logits
    assert logits.shape[-1] == len(tokenizer) and torch.isfinite(logits).all()


def test_chatml_template_with_im_end_as_eos(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    conversation = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "<answer>5</answer>"},
    ]
    assert tokenizer.apply_chat_template(conversation, tokenize=False) == (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n<answer>5</answer><|im_end|>\n"
    )
    # no default system message; the generation prompt opens the assistant turn
    assert tokenizer.apply_chat_template(conversation[:1], add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_auto_tokenizer_and_tokenizer_json_tokenize_alike(tiny_model_dir):
    # transformers 5 rebuilds a qwen2 tokenizer's pipeline; the saved one must be that pipeline
    text = "What is 17 + 25? <answer>42</answer> Hello, how are you today? Café 3.14"
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    assert AutoTokenizer.from_pretrained(tiny_model_dir)(text)["input_ids"] == raw.encode(text).ids


def test_builds_are_identical_and_leave_the_callers_random_state_alone(tmp_path, tiny_model_dir):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    other = build_tiny_model(tmp_path / "again")
    assert torch.equal(torch.rand(3), expected)
    a, b = load_file(tiny_model_dir / "model.safetensors"), load_file(other / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tiny_model_dir / "tokenizer.json").read_text() == (other / "tokenizer.json").read_text()


def test_a_complete_build_is_reused_and_a_lost_race_keeps_the_winner(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setitem(tiny.TINY_MODELS, "oxrl-tiny", lambda folder: pytest.fail("rebuilt a complete build"))
    assert build_tiny_model(tiny_model_dir) == tiny_model_dir

    target = tmp_path / "oxrl-tiny"

    def another_builder_finishes_first(folder):
        shutil.copytree(tiny_model_dir, target)
        (folder / "config.json").write_text("{}")

    monkeypatch.setitem(tiny.TINY_MODELS, "oxrl-tiny", another_builder_finishes_first)
    assert build_tiny_model(target) == target
    assert (target / "model.safetensors").is_file() and [p.name for p in tmp_path.iterdir()] == ["oxrl-tiny"]


def test_a_folder_that_is_not_a_build_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setitem(tiny.TINY_MODELS, "oxrl-tiny", lambda folder: (folder / "config.json").write_text("{}"))
    (tmp_path / "oxrl-tiny").mkdir()
    (tmp_path / "oxrl-tiny" / "notes.txt").write_text("mine")
    with pytest.raises(OxrlError, match="holds no complete oxrl-tiny build"):
        build_tiny_model(tmp_path / "oxrl-tiny")
    assert [p.name for p in tmp_path.iterdir()] == ["oxrl-tiny"]  # no staging folder left behind


def test_resolve_builds_under_the_checkpoint_dir(tmp_path, tiny_model_dir, monkeypatch):
    shutil.copytree(tiny_model_dir, tmp_path / "oxrl-tiny")
    monkeypatch.setenv("OXRL_CHECKPOINT_DIR", str(tmp_path))
    assert tiny.resolve_tiny_model() == tmp_path / "oxrl-tiny"
