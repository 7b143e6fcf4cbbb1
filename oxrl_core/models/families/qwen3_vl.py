"""Qwen3-VL: `Qwen3VLForConditionalGeneration`, interleaved M-RoPE, a vision tower of 16-pixel patches merged 2x2
(one image token per 32x32 pixels) whose blocks' features also enter the first decoder layers ("deepstack").

Chat: Qwen2-VL's (qwen2_vl.py).
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded
from oxrl_core.models.families.qwen2 import chatml_ids
from oxrl_core.models.families.qwen2_vl import TEMPLATE, vision_tokenizer

# deepstack: both blocks' merged features are added to the first two decoder layers' inputs
VISION = dict(
    depth=2,
    hidden_size=64,
    num_heads=1,
    intermediate_size=128,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=128,
    num_position_embeddings=64,
    deepstack_visual_indexes=[0, 1],
)


def build(folder: Path) -> None:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer, media_ids = vision_tokenizer()
    config = Qwen3VLConfig(
        text_config=dict(
            **TEXT_WIDTHS,
            **chatml_ids(tokenizer),
            vocab_size=len(tokenizer),
            head_dim=64,
            rms_norm_eps=1e-6,
            # M-RoPE as Qwen3-VL has it: the 32 frequencies interleaved over (time, height, width)
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5e6,
                "mrope_section": [8, 12, 12],
                "mrope_interleaved": True,
            },
        ),
        vision_config=VISION,
        **media_ids,
        tie_word_embeddings=True,
        dtype="float32",
    )
    save_seeded(Qwen3VLForConditionalGeneration, config, folder)
    save_processor(Qwen3VLProcessor, Qwen3VLVideoProcessor, tokenizer, folder)


def save_processor(processor_class, video_processor_class, tokenizer, folder: Path) -> None:
    """A Qwen3-VL-style processor: small images, at least 2x2 and at most 16x16 image tokens (64 to 512 pixels)."""
    from transformers import Qwen2VLImageProcessor

    images = Qwen2VLImageProcessor(patch_size=16, merge_size=2, min_pixels=64 * 64, max_pixels=512 * 512)
    processor_class(
        image_processor=images,
        tokenizer=tokenizer,
        video_processor=video_processor_class(),
        chat_template=TEMPLATE,
    ).save_pretrained(folder)


FAMILY = Family(
    model_types=("qwen3_vl",),
    tiny_model="oxrl-tiny-qwen3-vl",
    build=build,
    chat="ChatML; an image part renders `<|vision_start|><|image_pad|><|vision_end|>`",
)
