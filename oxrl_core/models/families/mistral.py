"""Mistral (Mistral-7B-Instruct v0.3): `MistralForCausalLM`, untied embeddings, no sliding window.

Chat: `<s>`, then `[INST] user [/INST]` and the assistant's content followed by `</s>`; roles must alternate
user/assistant (the template refuses others), and a system message is put in front of the first user message, as
Mistral's templates before v0.3 did (v0.3's puts it before the last one, which rewrites earlier turns when a
conversation grows: no turn could then be masked by rendering its prefix). No generation prompt: the assistant
answers right after `[/INST]`.
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded, token_ids, train_tokenizer

TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Mistral: roles must alternate user/assistant after an optional system message') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + (system if loop.first else '') + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]


def build(folder: Path) -> None:
    from transformers import MistralConfig, MistralForCausalLM

    # no pad token, as Mistral's: batches pad with EOS
    tokenizer = train_tokenizer(SPECIAL_TOKENS, TEMPLATE, eos="</s>", pad=None, bos="<s>")
    tokenizer.save_pretrained(folder)
    config = MistralConfig(
        **TEXT_WIDTHS,
        **token_ids(tokenizer),
        vocab_size=len(tokenizer),
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        sliding_window=None,
        tie_word_embeddings=False,
        dtype="float32",
    )
    save_seeded(MistralForCausalLM, config, folder)


FAMILY = Family(
    model_types=("mistral",),
    tiny_model="oxrl-tiny-mistral",
    build=build,
    chat="`[INST] ... [/INST]` then the answer and `</s>`; user/assistant alternate; system before the first user",
)
