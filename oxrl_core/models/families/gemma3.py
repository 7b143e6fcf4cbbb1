"""Gemma 3 text (gemma-3-1b-it): `Gemma3ForCausalLM`, five sliding-window layers to one global in the real models
(here one of each), the local layers with their own rope base, q/k norms, embeddings scaled and tied.

Chat: Gemma's turns (gemma2.py); a system message is folded into the first user turn, ahead of its content.
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded, token_ids
from oxrl_core.models.families.gemma2 import TURNS, gemma_tokenizer

TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] | trim + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}" + TURNS
)


def build(folder: Path) -> None:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tokenizer = gemma_tokenizer(TEMPLATE)
    tokenizer.save_pretrained(folder)
    config = Gemma3TextConfig(
        **TEXT_WIDTHS,
        **token_ids(tokenizer),
        vocab_size=len(tokenizer),
        head_dim=64,
        query_pre_attn_scalar=64,
        sliding_window=16,  # shorter than a verify step's sequences, so the window masks something
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        dtype="float32",
    )
    save_seeded(Gemma3ForCausalLM, config, folder)


FAMILY = Family(
    model_types=("gemma3_text",),
    tiny_model="oxrl-tiny-gemma3",
    build=build,
    chat="Gemma's turns; a system message joins the first user turn",
)
