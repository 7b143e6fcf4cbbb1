"""Idefics3 (SmolVLM): `Idefics3ForConditionalGeneration`, a Llama language model and a SigLIP vision encoder over
tiles, whose patches are pixel-shuffled 2x2 into one token.

`oxrl-tiny-smolvlm`: a 2-layer encoder over 64x64 tiles (16-pixel patches: 4 image tokens a tile); its processor
resizes an image to at most 128 pixels a side and splits it into up to 2x2 tiles plus the whole image, framed by
Idefics3's tokens. Chat: ChatML here, an image part rendering `<image>`, which the processor expands.
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded
from oxrl_core.models.families.qwen2 import chatml_ids, chatml_tokenizer, media_template

# An image's tiles are framed by <fake_token_around_image> and named <row_i_col_j>, the whole by <global-img>
IDEFICS3_TOKENS = (
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
)
TEMPLATE = media_template({"image": "<image>"})


def build(folder: Path) -> None:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessor, Idefics3Processor

    tokenizer = chatml_tokenizer(IDEFICS3_TOKENS, TEMPLATE)
    config = Idefics3Config(
        text_config=dict(
            **TEXT_WIDTHS,
            **chatml_ids(tokenizer),
            model_type="llama",
            vocab_size=len(tokenizer),
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1e5},
            tie_word_embeddings=True,
        ),
        # a tile of 64x64 pixels is 4x4 patches of 16, 2x2 of them shuffled into one token: 4 image tokens a tile
        vision_config=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=1,
            image_size=64,
            patch_size=16,
        ),
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        dtype="float32",
    )
    save_seeded(Idefics3ForConditionalGeneration, config, folder)
    # An image is resized to at most 128 pixels a side and split into 64x64 tiles (at most 2x2) plus the whole
    # image shrunk to one tile, as SmolVLM splits into 384-pixel tiles.
    images = Idefics3ImageProcessor(size={"longest_edge": 128}, max_image_size={"longest_edge": 64})
    Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=4, chat_template=TEMPLATE
    ).save_pretrained(folder)


FAMILY = Family(
    model_types=("idefics3",),
    tiny_model="oxrl-tiny-smolvlm",
    build=build,
    chat="ChatML (SmolVLM's own is `User:`/`Assistant:` ended by `<end_of_utterance>`); an image part renders `<image>`",
)
