"""Finding a model (the built-in tiny model, a local folder, or a Hugging Face Hub id), what kind it is, and a loaded
multimodal model's media encoder."""

from pathlib import Path

import torch

from oxrl_core.errors import OxrlError
from oxrl_core.models.tiny import TINY_MODEL_NAME, TINY_MODELS, resolve_tiny_model


def resolve_model(name_or_path: str, key: str = "model.name_or_path") -> str:
    """A loadable folder or hub id for `model.name_or_path` (or the setting `key` names), or one clear error.

    The tiny models (TINY_MODELS: `oxrl-tiny`, `oxrl-tiny-vl`, ...) are built locally on first use; a local folder must hold a
    config.json and resolves to its absolute path (the actors' working folder may be another, as on a joined Ray
    cluster); anything else is tried as a hub id (cache first, the Hub when online).
    """
    if name_or_path in TINY_MODELS:
        return str(resolve_tiny_model(name_or_path))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise OxrlError(f"{key}={name_or_path!r}: folder has no config.json; expected a Hugging Face model folder")
        return str(path.resolve())
    if path.is_absolute() or name_or_path.startswith((".", "~")) or name_or_path.count("/") > 1:
        raise OxrlError(
            f"{key}={name_or_path!r}: no such folder; give a model folder, a Hub id (org/name) or {TINY_MODEL_NAME}"
        )
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        raise OxrlError(
            f"{key}={name_or_path!r}: not a local folder and not found in the Hugging Face cache or on the Hub "
            f"({str(e).splitlines()[0][:160]})"
        ) from None
    return name_or_path


def is_multimodal(model_path: str) -> bool:
    """Whether the model reads images or audio: its config has an encoder's for them."""
    from transformers import AutoConfig

    return is_multimodal_config(AutoConfig.from_pretrained(model_path))


def model_type(model_path: str) -> str:
    """The `model_type` in a model's config.json (a folder, or a Hub id as resolve_model gives it), no code run."""
    from transformers import PretrainedConfig

    return PretrainedConfig.get_config_dict(model_path)[0]["model_type"]


def is_multimodal_config(config) -> bool:
    """Whether a model's config has an encoder for images or audio beside its language model."""
    return any(getattr(config, name, None) is not None for name in ("vision_config", "audio_config"))


def meta_model(model_path: str, trust_remote_code: bool) -> torch.nn.Module:
    """The model's module tree from its config alone: built on the meta device, no weights read."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMultimodalLM

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    auto = AutoModelForMultimodalLM if is_multimodal_config(config) else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config, trust_remote_code=trust_remote_code)


def media_encoder(model: torch.nn.Module) -> torch.nn.Module:
    """The image or audio encoder of a multimodal model (Qwen-VL's with its merger into the language model's width;
    Idefics3's and Qwen2-Audio's without their projector)."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model  # under LoRA's PeftModel
    inner = getattr(causal_lm, "model", causal_lm)
    for name in ENCODER_NAMES:
        if hasattr(inner, name):
            return getattr(inner, name)
    raise ValueError(f"{type(model).__name__}: no media encoder found ({', '.join(ENCODER_NAMES)})")


ENCODER_NAMES = ("visual", "vision_tower", "vision_model", "audio_tower")
