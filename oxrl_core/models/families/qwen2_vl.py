"""Qwen2-VL: `Qwen2VLForConditionalGeneration`, the Qwen2 language model with 3-D M-RoPE (time, height, width) and a
vision tower of 14-pixel patches merged 2x2 (one image token per 28x28 pixels).

`oxrl-tiny-vl`: a 2-block tower, Qwen's vision tokens in the tokenizer, a ChatML template that renders
`{"type": "image"}` parts as Qwen's markers, and its processor (image processor + chat template) saved beside it.
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded
from oxrl_core.models.families.qwen2 import chatml_ids, chatml_tokenizer, media_template

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
TEMPLATE = media_template({"image": "<|vision_start|><|image_pad|><|vision_end|>"})  # Qwen-VL's markers


def vision_tokenizer():
    """ChatML with Qwen's vision tokens, and the config's ids of them."""
    tokenizer = chatml_tokenizer(VISION_TOKENS, TEMPLATE)
    ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))))
    media_ids = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }
    return tokenizer, media_ids


def build(folder: Path) -> None:
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tokenizer, media_ids = vision_tokenizer()
    config = Qwen2VLConfig(
        text_config=dict(
            **TEXT_WIDTHS,
            **chatml_ids(tokenizer),
            vocab_size=len(tokenizer),
            rms_norm_eps=1e-6,
            # M-RoPE: the 32 rotary frequencies of a 64-wide head split over (time, height, width)
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]},
        ),
        vision_config=dict(
            depth=2,
            embed_dim=64,
            num_heads=1,
            mlp_ratio=2,
            hidden_size=128,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        **media_ids,
        tie_word_embeddings=True,
        dtype="float32",
    )
    save_seeded(Qwen2VLForConditionalGeneration, config, folder)
    # Small images: at least 2x2 and at most 16x16 image tokens (56x56 to 448x448 pixels).
    images = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=448 * 448)
    Qwen2VLProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=TEMPLATE,
    ).save_pretrained(folder)


FAMILY = Family(
    model_types=("qwen2_vl",),
    tiny_model="oxrl-tiny-vl",
    build=build,
    chat="ChatML; an image part renders `<|vision_start|><|image_pad|><|vision_end|>`",
)
