"""Qwen3 dense (Qwen3-0.6B to 8B): `Qwen3ForCausalLM`, Qwen2's blocks with RMS norms on queries and keys per head
and no attention bias; tied embeddings, as the 0.6B model.

Chat: ChatML (`<|im_start|>role\\n` + content + `<|im_end|>\\n`), system allowed, `<|im_end|>` ends generation.
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded
from oxrl_core.models.families.qwen2 import chatml_ids, chatml_tokenizer


def build(folder: Path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    save_qwen3(Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=True), folder)


def save_qwen3(config_class, model_class, widths: dict, folder: Path) -> None:
    """A tiny Qwen3 of `config_class` and `model_class` (dense, or with the experts of `widths`), its tokenizer."""
    tokenizer = chatml_tokenizer()
    tokenizer.save_pretrained(folder)
    config = config_class(
        **TEXT_WIDTHS,
        **chatml_ids(tokenizer),
        vocab_size=len(tokenizer),
        head_dim=64,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        dtype="float32",
        **widths,
    )
    save_seeded(model_class, config, folder)


FAMILY = Family(
    model_types=("qwen3",),
    tiny_model="oxrl-tiny-qwen3",
    build=build,
    chat="ChatML; system allowed",
)
