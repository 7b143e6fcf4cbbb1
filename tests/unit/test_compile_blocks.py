"""Regional compilation (training/build.py:compile_blocks): each decoder layer is compiled, and nothing else (a vision
tower stays eager); and when `model.compile: auto` compiles."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

from oxrl_core.config.schema import SLConfig
from oxrl_core.training.build import compile_blocks, compiles_layers


def test_each_decoder_layer_is_compiled_and_nothing_around_them(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    compile_blocks(model)
    compiled = [name for name, m in model.named_modules() if m._compiled_call_impl is not None]
    assert compiled == [f"model.layers.{i}" for i in range(model.config.num_hidden_layers)]


def test_a_vision_language_models_decoder_layers_are_compiled_and_its_vision_blocks_stay_eager(tiny_vl_model_dir):
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir)
    compile_blocks(model, multimodal=True)
    compiled = [name for name, m in model.named_modules() if m._compiled_call_impl is not None]
    assert compiled == [f"model.language_model.layers.{i}" for i in range(model.config.text_config.num_hidden_layers)]


def test_under_zero3_each_layers_forward_is_compiled_once_and_its_hooks_stay_outside(tiny_model_dir):
    """A hook on a layer, as DeepSpeed's gathers are, reading a number that differs per layer (its `ds_id`): traced
    with the layer's whole call, the compiler would guard on it and recompile for each layer."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    graphs_before = counters["stats"]["unique_graphs"]  # the counters outlive reset()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for i, layer in enumerate(model.model.layers):
        layer.ds_id = i
        layer.register_forward_pre_hook(lambda module, args: None if module.ds_id >= 0 else args)
    compile_blocks(model, zero3=True)
    assert all(m._compiled_call_impl is None for m in model.modules())  # hooks run eager, outside
    model(input_ids=torch.tensor([[3, 4, 5]]), use_cache=False)
    assert counters["stats"]["unique_graphs"] - graphs_before == 1


def test_a_model_naming_no_repeated_block_is_compiled_whole():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    compile_blocks(model)
    assert [name for name, m in model.named_modules() if m._compiled_call_impl is not None] == [""]


@pytest.mark.parametrize(
    "compile, zero_stage, on_gpu, expected",
    [
        ("auto", 1, True, True),
        ("auto", 2, True, True),
        ("auto", 3, True, True),
        ("auto", 1, False, False),  # CPU
        (True, 3, True, True),
        (True, 1, False, True),
        (False, 1, True, False),  # said outright: as said
    ],
)
def test_auto_compiles_the_layers_on_gpus_at_every_zero_stage_and_an_explicit_setting_wins(
    compile, zero_stage, on_gpu, expected
):
    config = SLConfig.model_validate(
        {
            "data": {"train": [{"path": "d.jsonl"}]},
            "model": {"compile": compile},
            "deepspeed": {"zero_stage": zero_stage},
        }
    )
    assert compiles_layers(config, on_gpu) is expected
