"""Qwen2-Audio: `Qwen2AudioForConditionalGeneration`, a Qwen2 language model and a Whisper encoder over 30 s of
80-bin log-mel frames, strided and pooled to 25 audio tokens a second.

`oxrl-tiny-audio`: a 2-layer encoder and its processor (Whisper's feature extractor at 16 kHz). Chat: ChatML, an
audio part rendering `<|audio_bos|><|AUDIO|><|audio_eos|>`, which the processor expands. transformers writes its
language model under other names than the checkpoints' (models/names.py restores them).
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded
from oxrl_core.models.families.qwen2 import chatml_ids, chatml_tokenizer, media_template

AUDIO_TOKENS = ("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>")
TEMPLATE = media_template({"audio": "<|audio_bos|><|AUDIO|><|audio_eos|>"})  # Qwen2-Audio's


def build(folder: Path) -> None:
    from transformers import (
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    tokenizer = chatml_tokenizer(AUDIO_TOKENS, TEMPLATE)
    config = Qwen2AudioConfig(
        text_config=dict(
            **TEXT_WIDTHS,
            **chatml_ids(tokenizer),
            model_type="qwen2",
            vocab_size=len(tokenizer),
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        ),
        # Whisper's encoder, narrow, over Qwen2-Audio's 30 s (vLLM takes no other): 3000 mel frames, 1500 after its
        # strided convolution, 750 after its pooling; a clip of s seconds is 25 s audio tokens
        audio_config=dict(
            d_model=64,
            encoder_layers=2,
            encoder_attention_heads=1,
            encoder_ffn_dim=128,
            num_mel_bins=80,
            max_source_positions=1500,
        ),
        # Untied, as Qwen2-Audio-7B: tied, transformers 5.19 and vLLM 0.32 read the output layer the same way, but
        # transformers 5.17 and vLLM 0.26 did not (0.25 nats a token apart on text alone, tests/gpu/RESULTS.md)
        audio_token_index=tokenizer.convert_tokens_to_ids("<|AUDIO|>"),
        tie_word_embeddings=False,
        dtype="float32",
    )
    save_seeded(Qwen2AudioForConditionalGeneration, config, folder)
    features = WhisperFeatureExtractor(feature_size=80, sampling_rate=16000)
    Qwen2AudioProcessor(feature_extractor=features, tokenizer=tokenizer, chat_template=TEMPLATE).save_pretrained(folder)


FAMILY = Family(
    model_types=("qwen2_audio",),
    tiny_model="oxrl-tiny-audio",
    build=build,
    chat="ChatML; an audio part renders `<|audio_bos|><|AUDIO|><|audio_eos|>`",
)
