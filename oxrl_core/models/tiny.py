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

TINY_MODEL_NAME = "oxrl-tiny"
COMPLETE_MARKER = ".oxrl-tiny-complete"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def resolve_tiny_model() -> Path:
    """`$OXRL_CHECKPOINT_DIR/oxrl-tiny`, built on first use."""
    return build_tiny_model(Path(os.environ.get("OXRL_CHECKPOINT_DIR", "checkpoints")) / TINY_MODEL_NAME)


def build_tiny_model(path: Path) -> Path:
    """Build the model and tokenizer into `path` unless a complete build is there.

    Built in a temporary sibling and moved into place, so that concurrent
    builders never see a half-written folder.
    """
    path = Path(path)
    if (path / COMPLETE_MARKER).is_file():
        return path
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(staging)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=256, max_position_embeddings=1024, tie_word_embeddings=True, rms_norm_eps=1e-6,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"), eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, dtype="float32",
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(staging)
    (staging / COMPLETE_MARKER).write_text("")
    try:
        os.replace(staging, path)
    except OSError:  # another builder finished first
        shutil.rmtree(staging, ignore_errors=True)
        if not (path / COMPLETE_MARKER).is_file():
            raise
    return path


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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"], chat_template=CHATML_TEMPLATE, model_max_length=1024,
    )
