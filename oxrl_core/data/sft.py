"""SFT examples: chat-template tokenisation with a loss mask on assistant tokens, and collation."""

from dataclasses import dataclass

import jinja2
import numpy as np
import torch

from oxrl_core.data.media import KIND_FIELDS, expand_media_tokens, media_policy, message_media


@dataclass
class SFTExample:
    input_ids: list[int]
    target_mask: list[int]  # 1 where the token is a response token the loss trains on
    media: tuple[np.ndarray, ...] = ()  # images or audio clips, prepared (data/media.py): one per expansion, in order


def content_text(content: str | list[dict]) -> str:
    """A message's text: its content, or the text parts of a content list (media left out)."""
    return content if isinstance(content, str) else "".join(p["text"] for p in content if p["type"] == "text")


def tokenize_sft(messages: list[dict], tokenizer, max_len: int, tools: list[dict] | None = None) -> SFTExample:
    """Token ids of the templated conversation (offering `tools`, function specs, as an RL environment's prompt
    does), truncated to `max_len`; the mask marks every assistant turn.

    An assistant turn's tokens are what rendering the conversation through it adds
    to rendering the turns before it with the generation prompt: its content, the
    end-of-turn token and whatever the template puts after it (as TRL does), up to
    where the rendering of the whole conversation goes on otherwise.
    """
    return _tokenize_trained_turns(messages, 0, tokenizer, max_len, tools)


def tokenize_completion(prompt: list[dict], completion: list[dict], tokenizer, max_len: int) -> SFTExample:
    """Token ids of the templated `prompt + completion`, truncated to `max_len`; the mask marks only the
    completion's assistant turns (assistant turns inside the prompt are context), each as in tokenize_sft.
    """
    if not prompt:
        raise ValueError("empty prompt: no message before the completion")
    if not any(m["role"] == "assistant" and content_text(m["content"]).strip() for m in completion):
        raise ValueError("empty completion: no assistant message with content")
    return _tokenize_trained_turns(prompt + completion, len(prompt), tokenizer, max_len)


def _tokenize_trained_turns(
    messages: list[dict], first_trained: int, tokenizer, max_len: int, tools: list[dict] | None = None
) -> SFTExample:
    """The templated conversation through its last trained turn: the assistant turns from `first_trained` on."""
    if not tokenizer.chat_template:
        raise ValueError("the tokenizer has no chat template; SFT records are rendered with it")
    trained = [i for i, m in enumerate(messages) if i >= first_trained and m["role"] == "assistant"]
    if not trained:
        raise ValueError("no assistant message to train on")
    last = trained[-1]
    input_ids = chat_template_ids(tokenizer, messages[: last + 1], add_generation_prompt=False, tools=tools)
    target_mask = [0] * len(input_ids)
    for i in trained:
        before = chat_template_ids(tokenizer, messages[:i], add_generation_prompt=True, tools=tools)
        through = chat_template_ids(tokenizer, messages[: i + 1], add_generation_prompt=False, tools=tools)
        if input_ids[: len(before)] != before or through[: len(before)] != before:
            raise ValueError(
                "the chat template is not prefix-consistent: rendering a conversation does not start with the "
                "rendering of its earlier turns (e.g. it rewrites earlier turns), so assistant turns cannot be masked"
            )
        # the turn ends where the whole conversation's rendering goes on otherwise than this turn's alone: a
        # template may close a rendering with tokens it does not put between turns (Phi-3's EOS)
        end = len(before)
        while end < len(through) and end < len(input_ids) and through[end] == input_ids[end]:
            end += 1
        target_mask[len(before) : end] = [1] * (end - len(before))
    if 1 not in target_mask:
        raise ValueError("no assistant message to train on")
    media = tuple(message_media(messages[: last + 1]))
    media_token = media_policy(tokenizer.name_or_path).token_id if media else None
    if media_token in input_ids[max_len:]:  # the model needs an item's tokens all or none
        last = len(input_ids) - input_ids[::-1].index(media_token)
        raise ValueError(
            f"the media tokens run to token {last}; data.max_len={max_len} would cut them (raise it, or "
            f"use smaller images or shorter clips)"
        )
    if 1 not in target_mask[:max_len]:
        raise ValueError(
            f"prompt is {target_mask.index(1)} tokens; with data.max_len={max_len} no response token is left"
        )
    return SFTExample(input_ids[:max_len], target_mask[:max_len], media)


def chat_template_ids(
    tokenizer, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None
) -> list[int]:
    """Token ids of `messages` (and the `tools` offered, as function specs) rendered by the tokenizer's chat template;
    ValueError if the template refuses them."""
    if not messages:
        return []
    media = message_media(messages)
    if media:  # the template renders one placeholder per media part; the item itself is not its business
        messages = [
            {**m, "content": [{"type": p["type"]} if p["type"] in KIND_FIELDS else p for p in m["content"]]}
            if isinstance(m["content"], list)
            else m
            for m in messages
        ]
    try:
        # return_dict=False: transformers 5 otherwise returns a BatchEncoding, 4.x a list
        ids = list(
            tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
            )
        )
    except jinja2.TemplateError as e:  # templates reject conversations, e.g. roles that do not alternate
        raise ValueError(f"the chat template rejects this conversation: {e}") from None
    return expand_media_tokens(ids, media, media_policy(tokenizer.name_or_path)) if media else ids


def collate_sft(examples: list[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest: input_ids and attention_mask [B, T] long, response_mask [B, T-1] float.

    response_mask is prediction-aligned: response_mask[b, t] is 1 when the token
    that logits[b, t] predicts, x[b, t+1], is a response token.
    """
    length = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    target_mask = torch.zeros((len(examples), length), dtype=torch.float32)
    for b, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[b, :n] = torch.tensor(e.input_ids)
        attention_mask[b, :n] = 1
        target_mask[b, :n] = torch.tensor(e.target_mask, dtype=torch.float32)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": target_mask[:, 1:]}
    if any(e.media for e in examples):  # the rows' media in row order; media_counts [B]: how many are each row's
        batch |= {
            "media": [item for e in examples for item in e.media],
            "media_counts": torch.tensor([len(e.media) for e in examples]),
        }
    return batch
