"""What every family's tiny model is built from: a byte-level BPE tokenizer trained on a small built-in corpus, the
language model's small widths, and weights drawn from seed 0."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oxrl_core.models.names import restore_checkpoint_names

# The language model of every tiny model: 2 layers, hidden 128, 2 heads of 64 (vLLM's CPU kernels need head_dim 64)
# sharing 1 KV head; tiny enough to train a step in seconds on a CPU.
TEXT_WIDTHS = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=256,
    max_position_embeddings=1024,
)
# transformers 5 loads a qwen2 folder's tokenizer as Qwen2Tokenizer, which rebuilds the
# pipeline around the saved vocabulary with this split (one token per digit), NFC and
# byte-level; training with the same pipeline makes tokenizer.json and AutoTokenizer agree.
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


@dataclass(frozen=True)
class Family:
    """One architecture: its tiny model, and what the trainer and the sampler do otherwise for it than for any model
    (each such field names its reason where it is set, in the family's module)."""

    model_types: tuple[str, ...]  # the config.json `model_type`s it covers (a multimodal one's, and its text model's)
    tiny_model: str  # the name of its built-in tiny model (models/tiny.py builds it on first use)
    build: Callable[[Path], None]  # writes the tiny model's files into an empty folder
    chat: str  # its chat conventions, in a line (the table of docs/guides/models.md)
    # what a packed row (training/packing.py) needs done to the loaded model first, where it needs more than the
    # variable-length attention: Qwen3.5's recurrent layers run sequence by sequence
    prepare_packed: Callable[[Any], None] | None = None
    # the attention its trainer must load, where sdpa and the packed kernel compute another (then it runs padded)
    trainer_attention: str | None = None
    cpu_sampler_dtype: str | None = None  # the dtype vLLM's CPU kernels need for it, when not the trainer's
    # a mixture of experts: the class of its MoE layers' top-k router, whose choices the trainer counts and whose
    # load-balancing loss it can add (training/routing.py)
    router: str | None = None


def save_seeded(model_class, config, folder: Path) -> None:
    """The model's weights drawn from seed 0, saved into `folder`, without resetting the caller's random state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model_class(config).save_pretrained(folder)
    restore_checkpoint_names(folder, config.model_type)


def train_tokenizer(special_tokens: list[str], template: str, eos: str, pad: str | None, bos: str | None = None):
    """A byte-level BPE of about 1,000 tokens whose first ids are `special_tokens` (in that order), with the given
    EOS, pad (None: it has none, and batches pad with EOS) and BOS among them, and the family's chat template."""
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
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    named = {"eos_token": eos, "pad_token": pad, "bos_token": bos}
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        **{key: token for key, token in named.items() if token is not None},
        additional_special_tokens=[t for t in special_tokens if t not in named.values()],
        chat_template=template,
        model_max_length=1024,
    )


def token_ids(tokenizer) -> dict:
    """The config's bos/eos/pad ids from the tokenizer's tokens (None where it has none)."""
    return {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


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
