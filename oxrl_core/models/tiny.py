"""The built-in tiny model `oxrl-tiny`: built locally in seconds, never downloaded.

A 2-layer Qwen2 (hidden 128, 2 heads, 1 KV head: head_dim 64, which vLLM's CPU
kernels need) with tied embeddings and seeded random weights, and a byte-level
BPE tokenizer trained on a small built-in corpus, with a ChatML template and
`<|im_end|>` as EOS. The same files come out of every build.
"""

import os
import shutil
import tempfile
from pathlib import Path

from oxrl_core.errors import OxrlError

TINY_MODEL_NAME = "oxrl-tiny"
COMPLETE_MARKER = ".oxrl-tiny-complete"  # written last: a folder holding it is a whole build
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen's ChatML template without its tool support and without a default system message.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# transformers 5 loads a qwen2 folder's tokenizer as Qwen2Tokenizer, which rebuilds the
# pipeline around the saved vocabulary with this split (one token per digit), NFC and
# byte-level; training with the same pipeline makes tokenizer.json and AutoTokenizer agree.
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def resolve_tiny_model() -> Path:
    """`$OXRL_CHECKPOINT_DIR/oxrl-tiny`, built on first use."""
    return build_tiny_model(Path(os.environ.get("OXRL_CHECKPOINT_DIR", "checkpoints")) / TINY_MODEL_NAME)


def build_tiny_model(path: Path) -> Path:
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
        _write_model(staging)
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
        raise OxrlError(f"{path}: folder exists but holds no complete {TINY_MODEL_NAME} build; remove it to rebuild") from None
    return path


def _write_model(folder: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(folder)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=256, max_position_embeddings=1024, tie_word_embeddings=True, rms_norm_eps=1e-6,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):  # seed the weights without resetting the caller's random state
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(folder)


def _corpus() -> list[str]:
    """Text the tokenizer learns from: arithmetic in the demo's format, digits, plain English."""
    lines = [f"What is {a} + {b}? <answer>{a + b}</answer> What is {a} - {b}? <answer>{a - b}</answer>"
             for a in range(0, 100, 3) for b in range(0, 100, 7)]
    lines += [str(n) for n in range(1000)]
    lines += [
        "The quick brown fox jumps over the lazy dog.",
        "A language model predicts the next token from the ones before it.",
        "Reinforcement learning improves a policy with rewards from a verifier.",
        "user assistant system think answer question reasoning step solution",
        "Hello, how are you today? I am fine, thank you for asking.",
    ] * 20
    return lines


def _train_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"], chat_template=CHATML_TEMPLATE, model_max_length=1024,
    )
