"""Model families: what is special about each architecture oxrl trains, in that family's own module.

A family's module holds its built-in tiny model (the real model class and layer mix at small widths, with a
tokenizer and chat template of the family's real conventions), and what the rooms above must do differently for it:
whether its micro-batches may be packed into one row, and the dtype vLLM's CPU kernels need for it. Everything else
oxrl reads from the model's own files, so a model of a family listed here or not trains the same way.
"""

from oxrl_core.models.families import (
    gemma2,
    gemma3,
    idefics3,
    llama,
    mistral,
    phi3,
    qwen2,
    qwen2_5_vl,
    qwen2_audio,
    qwen2_vl,
    qwen3,
    qwen3_5,
    qwen3_5_moe,
    qwen3_moe,
    qwen3_vl,
)
from oxrl_core.models.families.base import Family

# the families the tests train, the text model most use first
FAMILIES: list[Family] = [
    module.FAMILY
    for module in (qwen2, qwen2_vl, qwen2_5_vl, qwen3_vl, idefics3, qwen2_audio)
    + (llama, mistral, gemma2, gemma3, phi3, qwen3, qwen3_5, qwen3_moe, qwen3_5_moe)
]
BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}


def family_of(model_type: str) -> Family | None:
    """The family of a config's `model_type`, None for one without a module here (it trains by its files alone)."""
    return BY_MODEL_TYPE.get(model_type)
