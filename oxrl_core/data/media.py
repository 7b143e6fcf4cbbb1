"""A record's media, images or audio: read, checked and prepared once, here, so that no loss learns that a prompt had
pictures or sound.

Records follow TRL's format: `images` (or one `image`) or `audios` (or one `audio`) beside
the conversation, whose messages hold one `{"type": "image"}` or `{"type": "audio"}` part
per item, in order (`[{"type": "audio"}, {"type": "text", "text": "How many beeps?"}]`).
Images are read by data/images.py, audio by data/audio.py.

Tokens: the chat template renders one placeholder per item; the model's own processor says
what that placeholder becomes for an item of its size (`MediaPolicy.expansion`: Qwen-VL's
`<|image_pad|>` once per 28x28 or 32x32 pixels, Idefics3's tiles framed by their row and
column tokens, Qwen2-Audio's `<|AUDIO|>` once per 40 ms), and the ids the model reads have
it replaced by that. vLLM is given the template's ids and expands them itself, to the same
ids. Per micro-batch, the same processor makes what the model's encoder reads
(`MediaPolicy.model_inputs`).

Supported, by model type: the Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), Idefics3
(SmolVLM) and Qwen2-Audio.
"""

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from oxrl_core.data.audio import read_audio
from oxrl_core.data.images import qwen_sized, read_image
from oxrl_core.models.hub import is_multimodal_config

MESSAGE_FIELDS = ("messages", "prompt", "completion", "chosen", "rejected")
KIND_FIELDS = {
    "image": ("images", "image"),
    "audio": ("audios", "audio"),
}  # a record's fields of each kind: a list, one


@dataclass(frozen=True)
class Family:
    """What oxrl knows of a model type's media: the rest comes from its processor."""

    kind: str  # "image" or "audio"
    token: str  # the placeholder its chat template renders once per item and its processor expands
    qwen_sizing: bool = False  # images resized here to what the processor would resize them to (data/images.py)


QWEN_VL = Family("image", "<|image_pad|>", qwen_sizing=True)
FAMILIES = {
    "qwen2_vl": QWEN_VL,
    "qwen2_5_vl": QWEN_VL,
    "qwen3_vl": QWEN_VL,
    "qwen3_5": QWEN_VL,
    "qwen3_5_moe": QWEN_VL,
    "idefics3": Family("image", "<image>"),
    "qwen2_audio": Family("audio", "<|AUDIO|>"),
}
MEDIA_MODEL_TYPES = tuple(FAMILIES)  # the multimodal models whose media oxrl trains


@lru_cache(maxsize=8)
def _processor(folder: str):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(folder)


@dataclass(frozen=True)
class MediaPolicy:
    """How a model takes its media: prepared by `prepare`, tokens by `expansion`, encoder inputs by `model_inputs`."""

    family: Family
    folder: str  # the model folder, whose processor this follows
    token_id: int

    @property
    def kind(self) -> str:
        return self.family.kind

    def prepare(self, value, folder: Path, index: int) -> np.ndarray:
        """Item `index` of a record, read (relative paths from `folder`) and made what both the trainer's processor
        and vLLM's take as it is: an image uint8 [H, W, 3], a clip float32 [N] at the extractor's rate."""
        processor = _processor(self.folder)
        if self.kind == "audio":
            extractor = processor.feature_extractor
            return read_audio(value, folder, index, extractor.sampling_rate, extractor.n_samples)
        image = read_image(value, folder, index)
        if self.family.qwen_sizing:
            images = processor.image_processor  # transformers keeps min_pixels and max_pixels in `size`
            image = qwen_sized(
                image,
                images.patch_size * images.merge_size,
                images.size["shortest_edge"],
                images.size["longest_edge"],
                index,
            )
        return image

    def expansion(self, item: np.ndarray) -> tuple[int, ...]:
        """The ids the placeholder of `item` becomes, as the model's processor expands it (they depend on its shape
        alone: read once per shape)."""
        return _expansion(self.folder, self.kind, self.family.token, item.shape)

    def media_tokens(self, item: np.ndarray) -> int:
        """How many of the expansion's ids are the placeholder: the positions the encoder's outputs fill."""
        return self.expansion(item).count(self.token_id)

    def sampler_data(self, media: tuple[np.ndarray, ...]) -> dict:
        """A prompt's media as vLLM's `multi_modal_data`."""
        if self.kind == "audio":
            return {"audio": [(clip, _processor(self.folder).feature_extractor.sampling_rate) for clip in media]}
        from PIL import Image

        return {"image": [Image.fromarray(image) for image in media]}

    def model_inputs(self, input_ids: torch.Tensor, media: list[np.ndarray], counts: list[int]) -> dict:
        """What the model reads beside a micro-batch's tokens: its processor's tensors for `media` (every row's items,
        in row order; `counts`: how many are each row's), and `input_ids` [B, T] with any placeholder that is not an
        item's replaced by id 0. Such a placeholder was sampled by the policy, which the engines stop at
        (rollout/engine.py): it ends its sequence, so what the model reads there changes no trained logprob, while
        read as a placeholder it would make the model look for media that is not there. A row's media tokens are its
        first placeholders: every item precedes what the policy wrote. Qwen-VL also reads `mm_token_type_ids` [B, T],
        1 on the image tokens (its M-RoPE positions come from them)."""
        processor = _processor(self.folder)
        if self.kind == "audio":
            extractor = processor.feature_extractor
            features = extractor(
                media,
                sampling_rate=extractor.sampling_rate,
                padding="max_length",
                return_attention_mask=True,
                return_tensors="pt",
            )
            inputs = {
                "input_features": features["input_features"],
                "feature_attention_mask": features["attention_mask"],
            }
        elif self.family.qwen_sizing:
            images = processor.image_processor(images=media, return_tensors="pt")
            inputs = {"pixel_values": images["pixel_values"], "image_grid_thw": images["image_grid_thw"]}
        else:  # Idefics3: the batch's images as one sample's, their tiles in order
            images = processor.image_processor(images=[media], return_tensors="pt")
            inputs = {"pixel_values": images["pixel_values"], "pixel_attention_mask": images["pixel_attention_mask"]}
        rows = iter(self.media_tokens(item) for item in media)
        is_media = torch.zeros_like(input_ids)
        for row, count in enumerate(counts):
            tokens = sum(next(rows) for _ in range(count))
            is_media[row, (input_ids[row] == self.token_id).nonzero().flatten()[:tokens]] = 1
        if self.family.qwen_sizing:
            inputs["mm_token_type_ids"] = is_media
        return inputs | {"input_ids": torch.where((input_ids == self.token_id) & (is_media == 0), 0, input_ids)}


@lru_cache(maxsize=4096)
def _expansion(folder: str, kind: str, token: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    processor = _processor(folder)
    if kind == "audio":
        extractor = processor.feature_extractor
        out = processor(
            text=[token],
            audio=[np.zeros(shape, np.float32)],
            sampling_rate=extractor.sampling_rate,
            add_special_tokens=False,
        )
    else:
        out = processor(text=[token], images=[np.zeros(shape, np.uint8)], add_special_tokens=False)
    return tuple(out["input_ids"][0])


@lru_cache(maxsize=8)
def media_policy(folder: str) -> MediaPolicy | None:
    """The media policy of the model in `folder`, or None: a text model. ValueError for a multimodal model oxrl
    does not train the media of."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    if not is_multimodal_config(config):
        return None
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise ValueError(
            f"{config.model_type!r} models' media are not supported; oxrl trains the media of "
            f"{', '.join(MEDIA_MODEL_TYPES)}"
        )
    return MediaPolicy(family, folder, _processor(folder).tokenizer.convert_tokens_to_ids(family.token))


def has_media(record: dict) -> bool:
    return any(record.get(field) is not None for fields in KIND_FIELDS.values() for field in fields)


def bind_media(record: dict, folder: Path, policy: MediaPolicy | None) -> dict:
    """The record with each media part of its conversations holding its item, prepared: `{"type": "image",
    "image": uint8 [H, W, 3]}`, `{"type": "audio", "audio": float32 [N]}`. Each conversation field numbers its parts
    from the first item; a completion (or chosen, rejected) after an explicit `prompt` goes on from the prompt's.
    ValueError(reason) for a bad item, a count of parts that is not the count of items, or media the model does not
    take."""
    kinds = [kind for kind, fields in KIND_FIELDS.items() if any(record.get(f) is not None for f in fields)]
    if policy is None:
        raise ValueError(f"the record has {kinds[0]}s but the model takes none (a text model)")
    if kinds != [policy.kind]:
        other = next(k for k in kinds if k != policy.kind)
        raise ValueError(f"the record has {other}s; the model takes {policy.kind}s only")
    many, one = KIND_FIELDS[policy.kind]
    values = record.get(many)
    if values is None:
        values = [record[one]]
    elif not isinstance(values, list):
        raise ValueError(f"field {many!r} must be a list, got {type(values).__name__}")
    media = [policy.prepare(value, folder, i) for i, value in enumerate(values)]
    bound, used = dict(record), 0
    after_prompt = _count_parts(record.get("prompt"), policy.kind)
    for field in MESSAGE_FIELDS:
        if not isinstance(record.get(field), list):
            continue
        first = (
            after_prompt if field in ("completion", "chosen", "rejected") and record.get("prompt") is not None else 0
        )
        bound[field], end = _with_media(record[field], media, first, policy.kind)
        used = max(used, end)
    if used != len(media):
        raise ValueError(
            f'the conversation has {used} {policy.kind} part(s) ({{"type": "{policy.kind}"}}) for '
            f"{len(media)} {policy.kind}(s); each needs one part, in order"
        )
    return bound


def message_media(messages: list[dict]) -> list[np.ndarray]:
    """The bound media of `messages`, in order."""
    return [
        part[part["type"]]
        for m in messages
        if isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] in KIND_FIELDS
    ]


def expand_media_tokens(ids: list[int], media: list[np.ndarray], policy: MediaPolicy) -> list[int]:
    """Rendered ids (one placeholder per item) with the k-th placeholder replaced by item k's expansion: the ids the
    model reads (its processor does the same)."""
    places = [i for i, token in enumerate(ids) if token == policy.token_id]
    if len(places) != len(media):
        raise ValueError(
            f"the chat template rendered {len(places)} placeholder(s) {policy.family.token} for "
            f"{len(media)} {policy.kind}(s)"
        )
    out, start = [], 0
    for place, item in zip(places, media):
        out += ids[start:place] + list(policy.expansion(item))
        start = place + 1
    return out + ids[start:]


def collapse_media_tokens(ids: list[int], media: tuple[np.ndarray, ...], policy: MediaPolicy) -> list[int]:
    """The rendered ids again: each item's expansion, in order, back to one placeholder (vLLM expands a token
    prompt's placeholders itself: given the expanded ids it would expand them again)."""
    out, start = [], 0
    for item in media:
        expansion = list(policy.expansion(item))
        at = next(i for i in range(start, len(ids)) if ids[i : i + len(expansion)] == expansion)
        out += ids[start:at] + [policy.token_id]
        start = at + len(expansion)
    return out + ids[start:]


def _count_parts(messages, kind: str) -> int:
    if not isinstance(messages, list):
        return 0
    return sum(
        1
        for m in messages
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, dict) and part.get("type") == kind
    )


def _with_media(messages: list, media: list[np.ndarray], first: int, kind: str) -> tuple[list, int]:
    """A copy of `messages` whose `kind` parts hold media[first], media[first + 1], ...; and the index after the last."""
    out, k = [], first
    for m in messages:
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            parts = []
            for part in m["content"]:
                if isinstance(part, dict) and part.get("type") == kind:
                    if k >= len(media):
                        raise ValueError(
                            f'more {kind} parts ({{"type": "{kind}"}}) than the {len(media)} {kind}(s) given'
                        )
                    part = {"type": kind, kind: media[k]}
                    k += 1
                parts.append(part)
            m = {**m, "content": parts}
        out.append(m)
    return out, k
