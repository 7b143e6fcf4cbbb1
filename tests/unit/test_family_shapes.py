"""benchmarks/rl_step.py's FAMILY_SHAPES, the GPU lane's real widths per model family, checked on the CPU before a GPU
ever sees them: each text shape has its registry entry's parameter count, each M-RoPE split covers the rotary
dimensions vLLM builds, and each family's template gives the benchmark's prompts of exactly PROMPT_TOKENS tokens."""

import re
import sys
from pathlib import Path

import pytest
from accelerate import init_empty_weights  # peft's own dependency
from transformers import AutoModelForCausalLM

from oxrl_core.model_registry.schema import SHIPPED_DIR, entry_file_name, load_entry
from oxrl_core.models.tiny import build_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import rl_step  # noqa: E402

FAMILIES = sorted(rl_step.FAMILY_SHAPES)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("family-shapes")


def _config(shape: str, tiny_models: Path):
    spec = rl_step.FAMILY_SHAPES[shape]
    return rl_step.family_config(build_tiny_model(tiny_models / spec["tiny"], spec["tiny"]), spec)


@pytest.mark.parametrize("shape", [s for s in FAMILIES if not re.search(r"-\d+l$", s)])  # not those at reduced depth
def test_each_text_family_shape_has_its_registry_entrys_parameter_count(shape, tiny_models):
    config = _config(shape, tiny_models)
    with init_empty_weights():  # parameters on the meta device, counted but never drawn
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()  # from_config leaves meta parameters untied
    entry = load_entry(SHIPPED_DIR / entry_file_name(rl_step.FAMILY_SHAPES[shape]["entry"]))
    assert sum(p.numel() for p in model.parameters()) == entry.params


def test_each_m_rope_family_shapes_split_covers_its_rotary_dimensions(tiny_models):
    checked = []
    for shape in FAMILIES:
        text = _config(shape, tiny_models).get_text_config()
        rope = text.rope_parameters or {}
        if "mrope_section" in rope:  # vLLM's MRotaryEmbedding refuses any split but this one
            assert sum(rope["mrope_section"]) == int(text.head_dim * rope.get("partial_rotary_factor", 1.0)) // 2
            checked.append(shape)
    assert checked == ["qwen3.5-27b-16l"]


@pytest.mark.parametrize("shape", FAMILIES)
def test_each_familys_template_gives_the_benchmarks_prompts_their_exact_length(shape, tiny_models, tmp_path):
    spec = rl_step.FAMILY_SHAPES[shape]
    tiny = build_tiny_model(tiny_models / spec["tiny"], spec["tiny"])
    lines = rl_step.write_prompts(tiny, tmp_path / "prompts.jsonl", 12).read_text().splitlines()
    assert len(lines) == 12  # write_prompts asserts every one is PROMPT_TOKENS long under the template
