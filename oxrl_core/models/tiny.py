"""The built-in tiny models (TINY_MODELS): built locally in seconds, never downloaded.

`oxrl-tiny`: a 2-layer Qwen2 (hidden 128, 2 heads, 1 KV head: head_dim 64, which
vLLM's CPU kernels need) with tied embeddings and seeded random weights, and a
byte-level BPE tokenizer trained on a small built-in corpus, with a ChatML
template and `<|im_end|>` as EOS.

`oxrl-tiny-vl`: the same language model inside a Qwen2-VL (3-D M-RoPE), with a
2-block vision tower (14-pixel patches, 2x2 merged: one image token per 28x28
pixels), Qwen's vision tokens in the tokenizer, a template that renders
`{"type": "image"}` parts as Qwen's, and its processor (image processor + chat
template) saved beside it; it stands in for Qwen2-VL and Qwen2.5-VL.

`oxrl-tiny-qwen3-vl`: the same inside a Qwen3-VL (interleaved M-RoPE; a 2-block
vision tower of 16-pixel patches, 2x2 merged: one image token per 32x32 pixels,
whose blocks' features also enter the first decoder layers, "deepstack"); it
stands in for Qwen3-VL.

`oxrl-tiny-smolvlm`: the language model as a Llama inside an Idefics3 (SmolVLM) with a
2-layer SigLIP-style vision encoder over 64x64 tiles (16-pixel patches, 2x2 shuffled into
one token: 4 image tokens a tile); its processor resizes an image to at most 128 pixels a
side and splits it into up to 2x2 tiles plus the whole image, framed by Idefics3's tokens.

`oxrl-tiny-audio`: the language model inside a Qwen2-Audio with a 2-layer Whisper-style
encoder (80 mel bins over Qwen2-Audio's 30 s window: 25 audio tokens a second) and its
processor (Whisper's feature extractor at 16 kHz).

The same files come out of every build.
"""

import os
import shutil
import tempfile
from pathlib import Path

from oxrl_core.errors import OxrlError
from oxrl_core.models.names import restore_checkpoint_names

TINY_MODEL_NAME = "oxrl-tiny"
TINY_VL_MODEL_NAME = "oxrl-tiny-vl"
TINY_QWEN3_VL_MODEL_NAME = "oxrl-tiny-qwen3-vl"
TINY_SMOLVLM_MODEL_NAME = "oxrl-tiny-smolvlm"
TINY_AUDIO_MODEL_NAME = "oxrl-tiny-audio"
COMPLETE_MARKER = ".oxrl-tiny-complete"  # written last: a folder holding it is a whole build
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Idefics3's: an image's tiles are framed by <fake_token_around_image> and named <row_i_col_j>, the whole by <global-img>
IDEFICS3_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
]
AUDIO_TOKENS = ["<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"]
# ChatML without a default system message. Tools offered (multi-turn RL, envs/) are listed in a system message
# first, compactly (a tiny model's context is short): `name(arguments): description` a line. The policy calls one as
# Qwen's models do, with a JSON object in <tool_call> tags; a `tool` message is a turn of its own.
CHATML_TEMPLATE = (
    '{% if tools %}{{ \'<|im_start|>system\nTools, called as <tool_call>{"name": ..., "arguments": {...}}</tool_call>:\n\' }}'
    "{% for tool in tools %}{{ tool.function.name + '(' + tool.function.parameters.properties | join(', ') + '): ' "
    "+ tool.function.description + '\n' }}{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _media_template(parts: dict[str, str]) -> str:
    """ChatML with a message's content either a string or a list of parts: text, or media rendered as `parts` says
    (part type -> its placeholder text)."""
    media = "".join(f"{{% elif part['type'] == '{kind}' %}}{{{{ '{text}' }}}}" for kind, text in parts.items())
    return (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' }}"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] == 'text' %}{{ part['text'] }}" + media + "{% endif %}"
        "{% endfor %}{% endif %}"
        "{{ '<|im_end|>' + '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )


CHATML_VL_TEMPLATE = _media_template({"image": "<|vision_start|><|image_pad|><|vision_end|>"})  # Qwen-VL's markers
CHATML_IDEFICS3_TEMPLATE = _media_template({"image": "<image>"})
CHATML_AUDIO_TEMPLATE = _media_template({"audio": "<|audio_bos|><|AUDIO|><|audio_eos|>"})  # Qwen2-Audio's
# transformers 5 loads a qwen2 folder's tokenizer as Qwen2Tokenizer, which rebuilds the
# pipeline around the saved vocabulary with this split (one token per digit), NFC and
# byte-level; training with the same pipeline makes tokenizer.json and AutoTokenizer agree.
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def resolve_tiny_model(name: str = TINY_MODEL_NAME) -> Path:
    """`$OXRL_CHECKPOINT_DIR/<name>` (one of TINY_MODELS), built on first use."""
    return build_tiny_model(Path(os.environ.get("OXRL_CHECKPOINT_DIR", "checkpoints")) / name, name)


def build_tiny_model(path: Path, name: str = TINY_MODEL_NAME) -> Path:
    """Build the model and tokenizer into `path` unless a complete build is there.

    Built in a temporary sibling and renamed into place, so that concurrent
    builders (other processes) never see a half-written folder.
    """
    path = Path(path)
    if (path / COMPLETE_MARKER).is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the build is read like any other model folder
    try:
        TINY_MODELS[name](staging)
        (staging / COMPLETE_MARKER).write_text("")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        os.replace(staging, path)
    except OSError:  # `path` is a non-empty folder: another builder's finished build, or something else
        shutil.rmtree(staging, ignore_errors=True)
        if (path / COMPLETE_MARKER).is_file():
            return path
        if not path.is_dir():
            raise
        raise OxrlError(
            f"{path}: folder exists but holds no complete {TINY_MODEL_NAME} build; remove it to rebuild"
        ) from None
    return path


def _save_seeded(model_class, config, folder: Path) -> None:
    """The model's weights drawn from seed 0, saved into `folder`, without resetting the caller's random state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model_class(config).save_pretrained(folder)
    restore_checkpoint_names(folder, config.model_type)


def _write_model(folder: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(folder)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=256,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    _save_seeded(Qwen2ForCausalLM, config, folder)


def _write_vision_model(folder: Path) -> None:
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tokenizer = _train_tokenizer(VISION_TOKENS, CHATML_VL_TEMPLATE)
    ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=256,
            max_position_embeddings=1024,
            rms_norm_eps=1e-6,
            # M-RoPE: the 32 rotary frequencies of a 64-wide head split over (time, height, width)
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]},
            bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
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
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        dtype="float32",
    )
    _save_seeded(Qwen2VLForConditionalGeneration, config, folder)
    # Small images: at least 2x2 and at most 16x16 image tokens (56x56 to 448x448 pixels).
    images = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=448 * 448)
    Qwen2VLProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=CHATML_VL_TEMPLATE,
    ).save_pretrained(folder)


def _write_qwen3_vision_model(folder: Path) -> None:
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer = _train_tokenizer(VISION_TOKENS, CHATML_VL_TEMPLATE)
    ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=64,
            intermediate_size=256,
            max_position_embeddings=1024,
            rms_norm_eps=1e-6,
            # M-RoPE as Qwen3-VL has it: the 32 frequencies interleaved over (time, height, width)
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5e6,
                "mrope_section": [8, 12, 12],
                "mrope_interleaved": True,
            },
            bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ),
        # deepstack: both blocks' merged features are added to the first two decoder layers' inputs
        vision_config=dict(
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
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        dtype="float32",
    )
    _save_seeded(Qwen3VLForConditionalGeneration, config, folder)
    # Small images: at least 2x2 and at most 16x16 image tokens (64x64 to 512x512 pixels).
    images = Qwen2VLImageProcessor(patch_size=16, merge_size=2, min_pixels=64 * 64, max_pixels=512 * 512)
    Qwen3VLProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(),
        chat_template=CHATML_VL_TEMPLATE,
    ).save_pretrained(folder)


def _write_smolvlm_model(folder: Path) -> None:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessor, Idefics3Processor

    tokenizer = _train_tokenizer(IDEFICS3_TOKENS, CHATML_IDEFICS3_TEMPLATE)
    config = Idefics3Config(
        text_config=dict(
            model_type="llama",
            vocab_size=len(tokenizer),
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=256,
            max_position_embeddings=1024,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1e5},
            bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
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
    _save_seeded(Idefics3ForConditionalGeneration, config, folder)
    # An image is resized to at most 128 pixels a side and split into 64x64 tiles (at most 2x2) plus the whole
    # image shrunk to one tile, as SmolVLM splits into 384-pixel tiles.
    images = Idefics3ImageProcessor(size={"longest_edge": 128}, max_image_size={"longest_edge": 64})
    Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=4, chat_template=CHATML_IDEFICS3_TEMPLATE
    ).save_pretrained(folder)


def _write_audio_model(folder: Path) -> None:
    from transformers import (
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    tokenizer = _train_tokenizer(AUDIO_TOKENS, CHATML_AUDIO_TEMPLATE)
    config = Qwen2AudioConfig(
        text_config=dict(
            model_type="qwen2",
            vocab_size=len(tokenizer),
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=256,
            max_position_embeddings=1024,
            rms_norm_eps=1e-6,
            bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
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
    _save_seeded(Qwen2AudioForConditionalGeneration, config, folder)
    features = WhisperFeatureExtractor(feature_size=80, sampling_rate=16000)
    Qwen2AudioProcessor(
        feature_extractor=features, tokenizer=tokenizer, chat_template=CHATML_AUDIO_TEMPLATE
    ).save_pretrained(folder)


TINY_MODELS = {
    TINY_MODEL_NAME: _write_model,
    TINY_VL_MODEL_NAME: _write_vision_model,
    TINY_QWEN3_VL_MODEL_NAME: _write_qwen3_vision_model,
    TINY_SMOLVLM_MODEL_NAME: _write_smolvlm_model,
    TINY_AUDIO_MODEL_NAME: _write_audio_model,
}  # name -> what builds it


def _corpus() -> list[str]:
    """Text the tokenizer learns from: arithmetic in the demo's format, digits, plain English."""
    lines = [
        f"What is {a} + {b}? <answer>{a + b}</answer> What is {a} - {b}? <answer>{a - b}</answer>"
        for a in range(0, 100, 3)
        for b in range(0, 100, 7)
    ]
    lines += [str(n) for n in range(1000)]
    lines += [
        "The quick brown fox jumps over the lazy dog.",
        "A language model predicts the next token from the ones before it.",
        "Reinforcement learning improves a policy with rewards from a verifier.",
        "user assistant system think answer question reasoning step solution",
        "Hello, how are you today? I am fine, thank you for asking.",
    ] * 20
    return lines


def _train_tokenizer(media_tokens: list[str] = (), template: str = CHATML_TEMPLATE):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIAL_TOKENS + list(media_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", *media_tokens],
        chat_template=template,
        model_max_length=1024,
    )
