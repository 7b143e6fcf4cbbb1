"""Phi-3 (Phi-3.5-mini, Phi-4): `Phi3ForCausalLM`, attention's q/k/v in one `qkv_proj` and the MLP's gate and up in
one `gate_up_proj` (so LoRA targets those names, and vLLM loads them fused as they are), untied embeddings.

Chat: `<|system|>`, `<|user|>`, `<|assistant|>` turns, each `\\n` + content + `<|end|>\\n`; `<|end|>` ends a turn and
generation. The tokenizer's EOS is `<|endoftext|>`, which the template appends after the last turn when it renders
no generation prompt: a rendered conversation is not a prefix of its continuation there (data/sft.py takes each
turn's end from the whole conversation's rendering). `generation_config.json` lists both ends.
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded, token_ids, train_tokenizer

TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def build(folder: Path) -> None:
    from transformers import GenerationConfig, Phi3Config, Phi3ForCausalLM

    tokenizer = train_tokenizer(SPECIAL_TOKENS, TEMPLATE, eos="<|endoftext|>", pad="<|endoftext|>", bos="<s>")
    tokenizer.save_pretrained(folder)
    ends = tokenizer.convert_tokens_to_ids(["<|end|>", "<|endoftext|>"])
    config = Phi3Config(
        **TEXT_WIDTHS,
        **token_ids(tokenizer) | {"eos_token_id": ends},
        vocab_size=len(tokenizer),
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        dtype="float32",
    )
    save_seeded(Phi3ForCausalLM, config, folder)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=ends, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(folder)


FAMILY = Family(
    model_types=("phi3",),
    tiny_model="oxrl-tiny-phi3",
    build=build,
    chat="`<|system|>`/`<|user|>`/`<|assistant|>` turns ended by `<|end|>`; EOS `<|endoftext|>` after the last",
)
