"""Gemma 2 (gemma-2-2b-it): `Gemma2ForCausalLM`, sliding-window and global attention layers alternating, attention
logits soft-capped at 50 and the output logits at 30 (`final_logit_softcapping`: the trainer keeps the model's own
output layer, training/fused_head.py), embeddings scaled by sqrt(hidden) and tied.

Chat: `<bos>`, then each turn as `<start_of_turn>user\\n` or `<start_of_turn>model\\n` (the assistant is "model") +
content + `<end_of_turn>\\n`; a system message is refused, roles must alternate; generation prompt
`<start_of_turn>model\\n`, and `<end_of_turn>` ends generation.
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded, token_ids, train_tokenizer

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
TURNS = (
    "{% for message in turns %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Gemma: roles must alternate user/assistant') }}"
    "{% endif %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n'"
    " + (system if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('Gemma 2: the system role is not supported') }}"
    "{% endif %}{% set system = '' %}{% set turns = messages %}" + TURNS
)


def gemma_tokenizer(template: str):
    """Gemma's special tokens at Gemma's ids (pad 0, eos 1, bos 2), `<end_of_turn>` ending a turn and generation."""
    return train_tokenizer(SPECIAL_TOKENS, template, eos="<end_of_turn>", pad="<pad>", bos="<bos>")


def build(folder: Path) -> None:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    tokenizer = gemma_tokenizer(TEMPLATE)
    tokenizer.save_pretrained(folder)
    config = Gemma2Config(
        **TEXT_WIDTHS,
        **token_ids(tokenizer),
        vocab_size=len(tokenizer),
        head_dim=64,
        query_pre_attn_scalar=64,
        sliding_window=16,  # shorter than a verify step's sequences, so the window masks something
        layer_types=["sliding_attention", "full_attention"],
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        dtype="float32",
    )
    save_seeded(Gemma2ForCausalLM, config, folder)


FAMILY = Family(
    model_types=("gemma2",),
    tiny_model="oxrl-tiny-gemma2",
    build=build,
    chat="`<start_of_turn>user|model` turns ended by `<end_of_turn>`; no system role; user/assistant alternate",
    trainer_attention="eager",  # the one of transformers' attentions that soft-caps attention logits, as vLLM does
)
