"""Qwen2 and Qwen2.5 (text): `Qwen2ForCausalLM`; `oxrl-tiny` is its tiny model, the one most of the tests train.

Chat: ChatML without a default system message. Tools offered (multi-turn RL, envs/) are listed in a system message
first, compactly (a tiny model's context is short): `name(arguments): description` a line. The policy calls one as
Qwen's models do, with a JSON object in <tool_call> tags; a `tool` message is a turn of its own. `<|im_end|>` ends a
turn and generation; `<|endoftext|>` pads.
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded, train_tokenizer

TEMPLATE = (
    '{% if tools %}{{ \'<|im_start|>system\nTools, called as <tool_call>{"name": ..., "arguments": {...}}</tool_call>:\n\' }}'
    "{% for tool in tools %}{{ tool.function.name + '(' + tool.function.parameters.properties | join(', ') + '): ' "
    "+ tool.function.description + '\n' }}{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def media_template(parts: dict[str, str]) -> str:
    """ChatML with a message's content either a string or a list of parts: text, or media rendered as `parts` says
    (part type -> its placeholder text)."""
    media = "".join(f"{{% elif part['type'] == '{kind}' %}}{{{{ '{text}' }}}}" for kind, text in parts.items())
    return (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' }}"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] == 'text' %}{{ part['text'] }}" + media + "{% endif %}"
        "{% endfor %}{% endif %}"
        "{{ '<|im_end|>' + '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )


def chatml_tokenizer(media_tokens: tuple[str, ...] = (), template: str = TEMPLATE):
    """Qwen's tokens (and a multimodal family's `media_tokens` after them) with a ChatML `template`."""
    return train_tokenizer(SPECIAL_TOKENS + list(media_tokens), template, eos="<|im_end|>", pad="<|endoftext|>")


def chatml_ids(tokenizer) -> dict:
    """The config's token ids of a ChatML tokenizer: Qwen's configs name `<|endoftext|>` their BOS."""
    return {
        "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def build(folder: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = chatml_tokenizer()
    tokenizer.save_pretrained(folder)
    config = Qwen2Config(
        **TEXT_WIDTHS,
        **chatml_ids(tokenizer),
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        dtype="float32",
    )
    save_seeded(Qwen2ForCausalLM, config, folder)


FAMILY = Family(
    model_types=("qwen2",),
    tiny_model="oxrl-tiny",
    build=build,
    chat="ChatML; system allowed; tools listed in a system message, called in `<tool_call>` tags",
)
