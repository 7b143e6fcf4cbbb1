"""Preference, unpaired (KTO) and continued-pretraining (CPT) examples: record formats, tokenisation, collation.

The record formats are TRL's (https://huggingface.co/docs/trl/dataset_formats):
preference pairs for DPO-style losses and reward models (DPO: Rafailov et al. 2023,
arXiv 2305.18290), unpaired labelled completions for KTO (Ethayarajh et al. 2024,
arXiv 2402.01306) and plain text for language modelling. Only completions are
trained on; the prompt is context. A null field counts as absent, because a parquet
row holds every column of its file.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from oxrl_core.data.records import DataReport, _as_turns, check_messages, load_examples, sft_messages
from oxrl_core.data.sft import SFTExample, chat_template_ids, collate_sft, content_text, tokenize_completion
from oxrl_core.errors import OxrlError


@dataclass
class PairExample:
    chosen: SFTExample  # prompt + chosen completion; the mask is on the completion only
    rejected: SFTExample  # the same prompt + rejected completion
    margin: float = 0.0  # reward models: by how much the chosen score should beat the rejected one (field "margin")


def preference_pair(record: dict, tokenizer, max_len: int) -> PairExample:
    """A preference record as a tokenized pair; ValueError(reason) when it is not one.

    Explicit prompt: {"prompt": str | messages, "chosen": str | messages, "rejected": str | messages},
    a string prompt being one user message and a string completion one assistant message.
    Implicit prompt: {"chosen": messages, "rejected": messages}, two whole conversations whose
    shared leading messages are the prompt (identical ones share all but their last message);
    what follows must start with an assistant message. Optional "margin": a number (default 0).
    Identical chosen and rejected completions are kept: a valid pair, if one that teaches nothing.
    """
    for name in ("chosen", "rejected"):
        if record.get(name) is None:
            raise ValueError(
                f"missing field {name!r} (a preference record needs 'chosen' and 'rejected', "
                "and 'prompt' unless both are whole conversations that start with it)"
            )
    if record.get("prompt") is not None:
        prompt = _prompt_turns(record["prompt"])
        chosen = _completion_turns(record["chosen"], "chosen")
        rejected = _completion_turns(record["rejected"], "rejected")
    else:
        prompt, chosen, rejected = _split_shared_prompt(record["chosen"], record["rejected"])
    margin = record.get("margin")
    if margin is None:
        margin = 0.0
    elif isinstance(margin, bool) or not isinstance(margin, int | float) or not math.isfinite(margin):
        raise ValueError(f"field 'margin' must be a finite number, got {margin!r:.80}")
    return PairExample(
        tokenize_completion(prompt, chosen, tokenizer, max_len),
        tokenize_completion(prompt, rejected, tokenizer, max_len),
        float(margin),
    )


def load_preference_examples(path: Path, tokenizer, max_len: int, strict: bool) -> tuple[list[PairExample], DataReport]:
    """Tokenized preference pairs of a file; bad records are skipped and reported (fatal when `strict`)."""
    _require_chat_template(tokenizer, path, "preference")
    return load_examples(
        path, lambda record: preference_pair(record, tokenizer, max_len), strict, "preference", tokenizer
    )


@dataclass
class UnpairedExample:
    example: SFTExample  # prompt + completion; the mask is on the completion only
    mismatched: SFTExample  # this prompt + another record's completion: KTO's KL-baseline estimate
    desirable: bool


@dataclass
class _Unpaired:
    """A converted record; its mismatched example needs another record, so it is built after the whole file."""

    prompt: list[dict]
    completion: list[dict]
    example: SFTExample
    desirable: bool


def load_unpaired_examples(
    path: Path, tokenizer, max_len: int, strict: bool
) -> tuple[list[UnpairedExample], DataReport]:
    """KTO examples of a file of {"prompt": str | messages, "completion": str | messages, "label": bool}.

    label true marks a desirable completion. The mismatched example of usable record i
    pairs its prompt with the completion of usable record (i + 1) mod n: a fixed
    rotation, so the KL baseline (which KTO estimates from unrelated prompt/completion
    pairs) is deterministic. A file whose labels are all alike loads; the loop warns.
    """
    _require_chat_template(tokenizer, path, "unpaired")

    def convert(record: dict) -> _Unpaired:
        for name in ("prompt", "completion", "label"):
            if record.get(name) is None:
                raise ValueError(
                    f"missing field {name!r} (an unpaired record needs 'prompt', 'completion' and "
                    "'label': true for a desirable completion, false for an undesirable one)"
                )
        label = record["label"]
        if not isinstance(label, bool):
            raise ValueError(f"field 'label' must be true or false (a JSON boolean), got {label!r:.80}")
        prompt, completion = _prompt_turns(record["prompt"]), _completion_turns(record["completion"], "completion")
        return _Unpaired(prompt, completion, tokenize_completion(prompt, completion, tokenizer, max_len), label)

    records, report = load_examples(path, convert, strict, "unpaired", tokenizer)
    if len(records) < 2:
        raise OxrlError(
            f"{path}: 1 usable unpaired record; KTO needs at least 2, because it estimates its KL "
            "baseline from each prompt paired with another record's completion"
        )
    examples = []
    for i, record in enumerate(records):
        other = records[(i + 1) % len(records)]
        mismatched = tokenize_completion(record.prompt, other.completion, tokenizer, max_len)
        examples.append(UnpairedExample(record.example, mismatched, record.desirable))
    return examples, report


def load_text_blocks(path: Path, tokenizer, max_len: int, strict: bool) -> tuple[list[SFTExample], DataReport]:
    """CPT examples: the documents {"text": str} of a file, packed into blocks of `max_len` tokens.

    Each text is tokenized as the tokenizer does by itself (with whatever special
    tokens it adds, e.g. a BOS) and followed by the EOS token; the documents are
    concatenated in file order and cut into blocks of `max_len` tokens, the last,
    shorter block kept when it has at least 2 tokens (one prediction). Every token is
    a target. Documents share blocks and attend to one another across the EOS
    separator, as Hugging Face's run_clm `group_texts` does. The report counts
    records, not blocks.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise OxrlError(
            f"model.name_or_path: its tokenizer has no EOS token; CPT documents ({path}) are separated by it"
        )

    def convert(record: dict) -> list[int]:
        text = record.get("text")
        if text is None:
            raise ValueError("missing field 'text' (a CPT record is {\"text\": string})")
        if not isinstance(text, str):
            raise ValueError(f"field 'text' must be a string, got {type(text).__name__}")
        if not text.strip():
            raise ValueError("empty text")
        return tokenizer(text)["input_ids"] + [eos]

    documents, report = load_examples(path, convert, strict, "CPT")
    stream = [token for document in documents for token in document]
    blocks = [stream[start : start + max_len] for start in range(0, len(stream), max_len)]
    if len(blocks[-1]) < 2:  # a lone token predicts nothing
        blocks.pop()
    return [SFTExample(block, [1] * len(block)) for block in blocks], report


def collate_pairs(pairs: list[PairExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Both sides in one batch for one forward: rows 0..N-1 chosen, rows N..2N-1 the rejected of the same pairs.

    input_ids and attention_mask [2N, T], response_mask [2N, T-1] (as collate_sft), margin [N] float32.
    """
    batch = collate_sft([p.chosen for p in pairs] + [p.rejected for p in pairs], pad_id)
    batch["margin"] = torch.tensor([p.margin for p in pairs], dtype=torch.float32)  # [N]
    return batch


def _require_chat_template(tokenizer, path: Path, kind: str) -> None:
    if not tokenizer.chat_template:
        raise OxrlError(
            f"model.name_or_path: its tokenizer has no chat template; {kind} records ({path}) are rendered with it"
        )


def _prompt_turns(value) -> list[dict]:
    turns = _as_turns(value, "user", "prompt")
    check_messages(turns)
    return turns


def _completion_turns(value, name: str) -> list[dict]:
    """A completion as messages; ValueError unless it starts with an assistant message and one has content."""
    turns = _as_turns(value, "assistant", name)
    check_messages(turns)
    if not any(m["role"] == "assistant" and content_text(m["content"]).strip() for m in turns):
        raise ValueError(f"empty completion in {name!r}: no assistant message with content")
    if turns[0]["role"] != "assistant":
        raise ValueError(
            f"the completion in {name!r} (what follows the prompt) must start with an assistant message, "
            f"got a {turns[0]['role']} message"
        )
    return turns


def _split_shared_prompt(chosen, rejected) -> tuple[list[dict], list[dict], list[dict]]:
    """(prompt, chosen completion, rejected completion) of two whole conversations that start with the same prompt."""
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(value, list):
            raise ValueError(
                f"without a 'prompt' field, {name!r} must be a whole conversation (a list of messages "
                f"starting with the prompt), got {type(value).__name__}"
            )
        check_messages(value)
    if chosen == rejected:  # nothing differs: the last message is the completion (as TRL's extract_prompt)
        shared = len(chosen) - 1
    else:
        shared = 0
        while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
            shared += 1
    if shared < 1:
        raise ValueError(
            "no shared prompt: without a 'prompt' field, 'chosen' and 'rejected' must be conversations "
            "that start with the same messages (the prompt)"
        )
    prompt = chosen[:shared]
    return prompt, _completion_turns(chosen[shared:], "chosen"), _completion_turns(rejected[shared:], "rejected")


@dataclass
class Demonstration:
    """SPIN: a prompt and its demonstrated answer (the chosen side); the rejected side is the policy's own."""

    prompt_ids: list[int]  # the prompt with the generation prompt: what the policy continues
    chosen: SFTExample  # prompt + the record's last assistant turn, mask on that turn


def load_demonstrations(
    path, tokenizer, max_len: int, max_prompt_len: int, strict: bool
) -> tuple[list[Demonstration], DataReport]:
    """SFT records (`messages`, or `prompt` + `completion`) as SPIN's demonstrations: the last assistant message
    is the answer, everything before it the prompt (later messages are not used)."""
    if not tokenizer.chat_template:
        raise OxrlError(
            f"model.name_or_path: its tokenizer has no chat template; the records of {path} are rendered with it"
        )

    def convert(record: dict) -> Demonstration:
        messages = sft_messages(record)
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        chosen = tokenize_completion(messages[:last], messages[last : last + 1], tokenizer, max_len)
        prompt_ids = chat_template_ids(tokenizer, messages[:last], add_generation_prompt=True)
        if len(prompt_ids) > max_prompt_len:
            raise ValueError(f"prompt is {len(prompt_ids)} tokens; rollout.max_prompt_len is {max_prompt_len}")
        return Demonstration(prompt_ids, chosen)

    return load_examples(Path(path), convert, strict, "SPIN", tokenizer)
