"""The built-in tiny models (TINY_MODELS): one per model family (models/families/), built locally in seconds, never
downloaded.

Each is its family's real model class and layer mix at small widths (a 2-layer language model, hidden 128, 2 heads
of 64 sharing 1 KV head) with seeded random weights, a byte-level BPE tokenizer trained on a small built-in corpus
with the family's special tokens and chat template, and for a multimodal family its processor. `oxrl-tiny` (Qwen2)
is the one most tests train; `oxrl-tiny-vl`, `oxrl-tiny-qwen3-vl`, `oxrl-tiny-smolvlm` and `oxrl-tiny-audio` the
multimodal loops'. The same files come out of every build.
"""

import os
import shutil
import tempfile
from pathlib import Path

from oxrl_core.errors import OxrlError
from oxrl_core.models.families import FAMILIES

TINY_MODELS = {family.tiny_model: family.build for family in FAMILIES}  # name -> what builds it
TINY_MODEL_NAME = "oxrl-tiny"
TINY_VL_MODEL_NAME = "oxrl-tiny-vl"
TINY_QWEN3_VL_MODEL_NAME = "oxrl-tiny-qwen3-vl"
TINY_SMOLVLM_MODEL_NAME = "oxrl-tiny-smolvlm"
TINY_AUDIO_MODEL_NAME = "oxrl-tiny-audio"
COMPLETE_MARKER = ".oxrl-tiny-complete"  # written last: a folder holding it is a whole build


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
        raise OxrlError(f"{path}: folder exists but holds no complete {name} build; remove it to rebuild") from None
    return path
