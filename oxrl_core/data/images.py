"""A record's images: read, checked and sized once, here, so that no loss learns that a prompt had pictures.

Records follow TRL's vision format: an `images` list (or one `image`) beside the
conversation, whose messages hold one `{"type": "image"}` part per image, in order
(`[{"type": "image"}, {"type": "text", "text": "How many squares?"}]`). An image is a
file path (relative to the data file's folder), a base64 string (or data URI), raw
bytes, or `{"bytes": ..., "path": ...}` as a parquet file written by `datasets` holds it.

Sizing: each image is resized here to the size the model's own processor would give
it (Qwen-VL's rule: sides multiples of patch x merge pixels, the area within
[min_pixels, max_pixels]). The trainer's processor and vLLM's then both get an
image already of such a size, resize nothing, and agree on its number of image
tokens. Images are kept as uint8 arrays [H, W, 3]: a third of the bytes of the
float pixel values the processor makes from them per micro-batch.

Supported: the Qwen-VL processors (Qwen2-VL, Qwen2.5-VL: (H / 28) x (W / 28) image
tokens per image; Qwen3-VL: (H / 32) x (W / 32)), whose image placeholder is `<|image_pad|>`.
"""

import base64
import binascii
import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

VISION_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")  # the vision-language models whose images oxrl trains
IMAGE_FIELDS = ("images", "image")
MESSAGE_FIELDS = ("messages", "prompt", "completion", "chosen", "rejected")
MAX_IMAGE_PIXELS = 40_000_000  # larger is refused as too large (decoding alone would take 120 MB and more)


@dataclass(frozen=True)
class ImagePolicy:
    """How a model sees images: the placeholder token and the resizing rule of its processor."""

    token: str  # the placeholder the chat template renders once per image
    token_id: int
    factor: int  # pixels per side of one image token: patch_size x merge_size
    min_pixels: int
    max_pixels: int

    def size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) the model's processor resizes an image to (Qwen-VL's smart_resize)."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def tokens(self, image: np.ndarray) -> int:
        """Image tokens of an image already sized by this policy."""
        return (image.shape[0] // self.factor) * (image.shape[1] // self.factor)


@lru_cache(maxsize=8)
def _processor_sizes(folder: str) -> tuple[int, int, int] | None:
    """(pixels per image token side, min_pixels, max_pixels) of a vision-language model folder's image processor; None
    for a text model."""
    from transformers import AutoConfig, AutoImageProcessor

    if getattr(AutoConfig.from_pretrained(folder), "vision_config", None) is None:
        return None
    processor = AutoImageProcessor.from_pretrained(folder)
    if not hasattr(processor, "merge_size"):
        raise ValueError(f"{type(processor).__name__} is not a Qwen-VL image processor; oxrl trains the images of the "
                         "Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL)")
    # transformers keeps min_pixels and max_pixels in `size`
    return processor.patch_size * processor.merge_size, processor.size["shortest_edge"], processor.size["longest_edge"]


def image_policy(tokenizer) -> ImagePolicy | None:
    """The image policy of the model whose tokenizer this is (its folder's image processor), or None: a text model."""
    sizes = _processor_sizes(str(tokenizer.name_or_path))
    if sizes is None:
        return None
    token = "<|image_pad|>"
    return ImagePolicy(token, tokenizer.convert_tokens_to_ids(token), *sizes)


def has_images(record: dict) -> bool:
    return any(record.get(field) is not None for field in IMAGE_FIELDS)


def bind_images(record: dict, folder: Path, policy: ImagePolicy | None) -> dict:
    """The record with each image part of its conversations holding its image, read and sized: `{"type": "image",
    "image": uint8 [H, W, 3]}`. Each conversation field numbers its image parts from the first image; a completion
    (or chosen, rejected) after an explicit `prompt` goes on from the prompt's. ValueError(reason) for a bad image,
    a count of image parts that is not the count of images, or a model that takes no images."""
    if policy is None:
        raise ValueError("the record has images but the model has no image processor (not a vision-language model)")
    values = record.get("images")
    if values is None:
        values = [record["image"]]
    elif not isinstance(values, list):
        raise ValueError(f"field 'images' must be a list, got {type(values).__name__}")
    images = [_sized(_read(value, folder, i), policy, i) for i, value in enumerate(values)]
    bound, used = dict(record), 0
    after_prompt = _count_image_parts(record.get("prompt"))
    for field in MESSAGE_FIELDS:
        if not isinstance(record.get(field), list):
            continue
        first = after_prompt if field in ("completion", "chosen", "rejected") and record.get("prompt") is not None else 0
        bound[field], end = _with_images(record[field], images, first)
        used = max(used, end)
    if used != len(images):
        raise ValueError(f"the conversation has {used} image part(s) ({{\"type\": \"image\"}}) for {len(images)} image(s); "
                         "each image needs one part, in order")
    return bound


def message_images(messages: list[dict]) -> list[np.ndarray]:
    """The bound images of `messages`, in order."""
    return [part["image"] for m in messages if isinstance(m["content"], list) for part in m["content"] if part["type"] == "image"]


def expand_image_tokens(ids: list[int], images: list[np.ndarray], policy: ImagePolicy) -> list[int]:
    """Rendered ids (one placeholder per image) with the k-th placeholder repeated as many times as image k has
    tokens: the ids the model reads (its processor does the same)."""
    places = [i for i, token in enumerate(ids) if token == policy.token_id]
    if len(places) != len(images):
        raise ValueError(f"the chat template rendered {len(places)} image placeholder(s) {policy.token} for "
                         f"{len(images)} image(s)")
    out, start = [], 0
    for place, image in zip(places, images):
        out += ids[start:place] + [policy.token_id] * policy.tokens(image)
        start = place + 1
    return out + ids[start:]


def collapse_image_tokens(ids: list[int], token_id: int) -> list[int]:
    """Each run of image placeholders as one, as a prompt is written before its processor expands it (vLLM expands a
    token prompt's placeholders itself: given the expanded ids it would expand them again)."""
    return [t for i, t in enumerate(ids) if t != token_id or i == 0 or ids[i - 1] != token_id]


def _count_image_parts(messages) -> int:
    if not isinstance(messages, list):
        return 0
    return sum(1 for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
               for part in m["content"] if isinstance(part, dict) and part.get("type") == "image")


def _with_images(messages: list, images: list[np.ndarray], first: int) -> tuple[list, int]:
    """A copy of `messages` whose image parts hold images[first], images[first + 1], ...; and the index after the last."""
    out, k = [], first
    for m in messages:
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            parts = []
            for part in m["content"]:
                if isinstance(part, dict) and part.get("type") == "image":
                    if k >= len(images):
                        raise ValueError(f"more image parts ({{\"type\": \"image\"}}) than the {len(images)} image(s) given")
                    part = {"type": "image", "image": images[k]}
                    k += 1
                parts.append(part)
            m = {**m, "content": parts}
        out.append(m)
    return out, k


def _read(value, folder: Path, index: int):
    """One image as a PIL image in RGB; ValueError naming the image for anything unreadable."""
    from PIL import Image, UnidentifiedImageError

    name = f"image {index}"
    if isinstance(value, dict):  # a `datasets` Image feature: bytes, else a path
        value = value.get("bytes") or value.get("path")
    if isinstance(value, str):
        path = Path(value).expanduser()
        path = path if path.is_absolute() else folder / path
        if value.startswith("data:image/"):
            value = value.partition(",")[2]
        elif _is_file(path):
            value = path.read_bytes()
            name = f"image {index} ({path})"
        if isinstance(value, str):
            try:
                value = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"{name}: no such file {str(path)!r:.120} and not base64 data") from None
    if not isinstance(value, bytes | bytearray):
        raise ValueError(f"{name}: expected a path, base64 string or bytes, got {type(value).__name__}")
    try:
        with Image.open(io.BytesIO(value)) as image:
            if image.width * image.height > MAX_IMAGE_PIXELS:
                raise ValueError(f"{name}: {image.width}x{image.height} pixels is too large (at most {MAX_IMAGE_PIXELS:,})")
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise ValueError(f"{name}: not a decodable image ({str(e).splitlines()[0][:120]})") from None


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for a path: base64 data
        return False


def _sized(image, policy: ImagePolicy, index: int) -> np.ndarray:
    from PIL import Image

    try:
        height, width = policy.size(image.height, image.width)
    except ValueError as e:  # an aspect ratio above 200
        raise ValueError(f"image {index}: {image.width}x{image.height}: {e}") from None
    if (height, width) != (image.height, image.width):
        image = image.resize((width, height), Image.Resampling.BICUBIC)
    return np.array(image, dtype=np.uint8)  # writable: torch.from_numpy warns of a read-only array


def vision_inputs(batch: dict, image_processor, image_token_id: int) -> dict:
    """What the model reads of a micro-batch's images, made by its own image processor: `pixel_values` [patches, C x T
    x P x P] and `image_grid_thw` [images, 3]; `mm_token_type_ids` [B, T], 1 on each row's image tokens (Qwen's M-RoPE
    positions come from them); `model_input_ids` [B, T]: the ids with any placeholder that is not an image's replaced
    by id 0. Such a placeholder was sampled by the policy, which the engines stop at (rollout/engine.py): it ends its
    sequence, so what the model reads there changes no trained logprob, while read as a placeholder it would make the
    model look for an image that is not there. A row's image tokens are its first placeholders, as many as its
    images have tokens: every image precedes what the policy wrote."""
    processed = image_processor(images=batch["images"], return_tensors="pt")
    grid = processed["image_grid_thw"]  # [images, 3]
    tokens = (grid.prod(-1) // image_processor.merge_size**2).split(batch["image_counts"].tolist())
    ids = batch["input_ids"]
    is_image = torch.zeros_like(ids)
    for row, row_tokens in enumerate(tokens):
        places = (ids[row] == image_token_id).nonzero().flatten()[:int(row_tokens.sum())]
        is_image[row, places] = 1
    model_ids = torch.where((ids == image_token_id) & (is_image == 0), 0, ids)
    return {"pixel_values": processed["pixel_values"], "image_grid_thw": grid, "mm_token_type_ids": is_image,
            "model_input_ids": model_ids}
