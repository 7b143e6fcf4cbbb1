"""Weight names as a model family's real checkpoints have them, where transformers writes others."""

import json
from pathlib import Path

# model type -> (the prefix transformers 5.19 writes, the checkpoints' own): it saves Qwen2-Audio's language model
# under `language_model.model.model.` (its two renamings of that module applied in turn), which neither vLLM nor the
# real checkpoints have
WRITTEN_PREFIXES = {"qwen2_audio": ("language_model.model.model.", "language_model.model.")}


def restore_checkpoint_names(folder: Path, model_type: str) -> None:
    """Rename, in the safetensors files `save_pretrained` just wrote to `folder` (and their index), the weights that
    transformers names otherwise than the family's checkpoints."""
    if model_type not in WRITTEN_PREFIXES:
        return
    from safetensors.torch import load_file, save_file

    written, real = WRITTEN_PREFIXES[model_type]
    rename = lambda name: real + name.removeprefix(written) if name.startswith(written) else name  # noqa: E731
    for file in Path(folder).glob("*.safetensors"):
        save_file({rename(name): w for name, w in load_file(file).items()}, file, metadata={"format": "pt"})
    index = Path(folder) / "model.safetensors.index.json"
    if index.is_file():
        content = json.loads(index.read_text())
        content["weight_map"] = {rename(name): file for name, file in content["weight_map"].items()}
        index.write_text(json.dumps(content, indent=2))
