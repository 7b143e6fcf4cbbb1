"""Llama 3.x (Llama 3.1/3.2, SmolLM2, DeepSeek-R1-Distill-Llama): `LlamaForCausalLM` with Llama 3's rope scaling.

Chat: `<|begin_of_text|>`, then each turn as `<|start_header_id|>role<|end_header_id|>\\n\\n` + content + `<|eot_id|>`;
a system turn is allowed; `<|eot_id|>` ends a turn and generation. Tied embeddings, as Llama 3.2 1B and 3B.
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded, token_ids, train_tokenizer

TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|finetune_right_pad_id|>",
]


def build(folder: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = train_tokenizer(
        SPECIAL_TOKENS, TEMPLATE, eos="<|eot_id|>", pad="<|finetune_right_pad_id|>", bos="<|begin_of_text|>"
    )
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        **TEXT_WIDTHS,
        **token_ids(tokenizer),
        vocab_size=len(tokenizer),
        head_dim=64,
        rms_norm_eps=1e-5,
        # Llama 3.1's: low frequencies stretched 8x, high ones kept, a smooth ramp between
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        tie_word_embeddings=True,
        dtype="float32",
    )
    save_seeded(LlamaForCausalLM, config, folder)


FAMILY = Family(
    model_types=("llama",),
    tiny_model="oxrl-tiny-llama",
    build=build,
    chat="`<|start_header_id|>role<|end_header_id|>` turns ended by `<|eot_id|>`; system allowed",
)
