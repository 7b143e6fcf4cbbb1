"""SFT examples: chat-template tokenisation with a loss mask on assistant tokens, and collation."""

from dataclasses import dataclass

import torch

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class SFTExample:
    input_ids: list[int]
    target_mask: list[int]  # 1 where the token is a response token the loss trains on


def sft_messages(record: dict) -> list[dict]:
    """A TRL-style SFT record as a conversation; ValueError(reason) when it is not one.

    Accepted: {"messages": [...]} or {"prompt": str | [...], "completion": str | [...]}.
    """
    if "messages" in record:
        messages = record["messages"]
    elif "prompt" in record or "completion" in record:
        for field in ("prompt", "completion"):
            if field not in record:
                raise ValueError(f"missing field {field!r} (an SFT record needs 'messages', or 'prompt' and 'completion')")
        prompt, completion = record["prompt"], record["completion"]
        if isinstance(completion, str) and not completion.strip():
            raise ValueError("empty completion")
        messages = _as_turns(prompt, "user", "prompt") + _as_turns(completion, "assistant", "completion")
    else:
        raise ValueError(f"no 'messages' or 'prompt'/'completion' fields (found: {', '.join(sorted(record)) or 'none'})")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in ROLES:
            raise ValueError(f"message {i} must be {{role: one of {', '.join(ROLES)}, content: string}}, got {str(m)[:80]}")
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise ValueError("empty response: no assistant message with content")
    return messages


def _as_turns(value, role: str, field: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return value
    raise ValueError(f"field {field!r} must be a string or a list of messages, got {type(value).__name__}")


def tokenize_sft(messages: list[dict], tokenizer, max_len: int) -> SFTExample:
    """Token ids of the templated conversation; the mask marks every assistant turn (with its end token)."""
    if not tokenizer.chat_template:
        raise ValueError("the tokenizer has no chat template; SFT records need one")
    input_ids: list[int] = []
    target_mask: list[int] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _template_ids(tokenizer, messages[:i], add_generation_prompt=True)
        through = _template_ids(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if through[: len(before)] != before or before[: len(input_ids)] != input_ids:
            raise ValueError("the chat template does not render a conversation as a prefix of its continuation")
        target_mask += [0] * (len(before) - len(input_ids)) + [1] * (len(through) - len(before))
        input_ids = through
    if sum(target_mask[:max_len]) == 0:
        first = target_mask.index(1)
        raise ValueError(f"prompt is {first} tokens; with data.max_len={max_len} no response token is left")
    return SFTExample(input_ids[:max_len], target_mask[:max_len])


def _template_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    if not messages:
        return []
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def collate_sft(examples: list[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest. response_mask [B, T-1] is prediction-aligned: 1 where the *target* x[t+1] is a response token."""
    length = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    target_mask = torch.zeros((len(examples), length), dtype=torch.float32)
    for b, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[b, :n] = torch.tensor(e.input_ids)
        attention_mask[b, :n] = 1
        target_mask[b, :n] = torch.tensor(e.target_mask, dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": target_mask[:, 1:]}
