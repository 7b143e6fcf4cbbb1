"""Regional compilation (training/engine.py:compile_blocks): each decoder layer is compiled, and nothing else."""

import torch
from transformers import AutoModelForCausalLM

from oxrl_core.training.engine import compile_blocks


def test_each_decoder_layer_is_compiled_and_nothing_around_them(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    compile_blocks(model)
    compiled = [name for name, m in model.named_modules() if m._compiled_call_impl is not None]
    assert compiled == [f"model.layers.{i}" for i in range(model.config.num_hidden_layers)]


def test_a_model_naming_no_repeated_block_is_compiled_whole():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    compile_blocks(model)
    assert [name for name, m in model.named_modules() if m._compiled_call_impl is not None] == [""]
