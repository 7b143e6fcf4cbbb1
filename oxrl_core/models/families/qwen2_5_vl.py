"""Qwen2.5-VL: `Qwen2_5_VLForConditionalGeneration`, Qwen2-VL with a vision tower whose blocks attend within windows
of 112 pixels (8x8 patches) except a few full-attention blocks, RMS norms and gated MLPs in the tower.

`oxrl-tiny-qwen2-5-vl`: a 2-block tower, the first windowed (windows of 56 pixels: 2x2 image tokens, smaller than
most images) and the second full. Chat and processor: Qwen2-VL's (qwen2_vl.py).
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded
from oxrl_core.models.families.qwen2 import chatml_ids
from oxrl_core.models.families.qwen2_vl import TEMPLATE, vision_tokenizer


def build(folder: Path) -> None:
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    tokenizer, media_ids = vision_tokenizer()
    config = Qwen2_5_VLConfig(
        text_config=dict(
            **TEXT_WIDTHS,
            **chatml_ids(tokenizer),
            vocab_size=len(tokenizer),
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]},
        ),
        vision_config=dict(
            depth=2,
            hidden_size=64,
            num_heads=1,
            intermediate_size=128,
            out_hidden_size=128,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[1],
        ),
        **media_ids,
        tie_word_embeddings=True,
        dtype="float32",
    )
    save_seeded(Qwen2_5_VLForConditionalGeneration, config, folder)
    images = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=448 * 448)
    Qwen2_5_VLProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=TEMPLATE,
    ).save_pretrained(folder)


FAMILY = Family(
    model_types=("qwen2_5_vl",),
    tiny_model="oxrl-tiny-qwen2-5-vl",
    build=build,
    chat="ChatML; an image part renders `<|vision_start|><|image_pad|><|vision_end|>`",
)
