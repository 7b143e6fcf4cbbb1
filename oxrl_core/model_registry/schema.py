"""A registry entry: what oxrl knows about one model, validated by pydantic.

Entries ship in `entries/` (one `<org>--<name>.yaml` per model) and `oxrl onboard`
writes them for new models. An entry is `config-ready` when its facts and configs
come from the model's files; `verified` once `oxrl onboard --verify` ran an SFT step
and an RL step on it, with the date and the package versions.
"""

from datetime import date
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from oxrl_core.errors import OxrlError

SHIPPED_DIR = Path(__file__).with_name("entries")
PositiveInt = Annotated[int, Field(gt=0)]


class RegistryEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(description="Hugging Face Hub id (org/name), or the local folder the entry was made from.")
    architecture: str = Field(description="The class named in config.json `architectures`, e.g. Qwen2ForCausalLM.")
    model_type: str = Field(description="config.json `model_type`.")
    model_class: Literal["causal-lm", "image-text-to-text", "audio-text-to-text"]
    params: PositiveInt = Field(description="All parameters (tied weights counted once).")
    active_params: PositiveInt | None = Field(
        None, description="Parameters used per token; mixture-of-experts models only."
    )
    context_length: PositiveInt = Field(description="max_position_embeddings of the language model.")
    dtype: str = Field(description="The dtype the checkpoint is stored in.")
    vocab_size: PositiveInt = Field(description="Rows of the embedding matrix.")
    chat_template: bool = Field(description="The tokenizer ships a chat template.")
    oxrl_trainable: bool = Field(
        description="oxrl's trainer can load it (transformers' AutoModelForCausalLM has a class for it, "
        "or it is a multimodal model whose media oxrl trains: the Qwen-VL families, Idefics3, Qwen2-Audio)."
    )
    tiny_model: str | None = Field(
        None,
        description="The built-in tiny model of its family (same architecture class and "
        "processor, small widths), on which the tests train it end to end.",
    )
    recommended_mode: Literal["full", "lora"] = Field(
        description="Full fine-tuning or LoRA, by the rule in scout.recommend_mode."
    )
    gpu_memory_gb: PositiveInt = Field(description="Total GPU memory the recommendation was made for.")
    lora_targets: list[str] = Field(
        min_length=1, description="Linear layers of the language model that get LoRA adapters by default."
    )
    status: Literal["config-ready", "verified"] = "config-ready"
    verified_date: date | None = Field(None, strict=False)  # YAML may hold it as a date or an ISO string
    verified_versions: dict[str, str] | None = None
    verified_by: str | None = Field(
        None,
        description="The model --verify ran, its scale and the machine: the entry's own, or its family's tiny one.",
    )
    verified_gap: dict[str, float | str] | None = Field(
        None,
        description="The sampler-trainer gap --verify measured (mean |log p| per response token): from the "
        "checkpoint, after a refresh, and the engines' dtype; a mixture of experts' routing agreement too (the "
        "lower step's share of token-layers whose trainer router chose the engine's experts, replayed regardless).",
    )

    unverified_because: str | None = Field(
        None, description="Why a shipped entry is not verified, in a line; only an entry that is not verified has it."
    )

    @model_validator(mode="after")
    def _consistent(self):
        if self.active_params is not None and self.active_params > self.params:
            raise ValueError(f"active_params={self.active_params} is more than params={self.params}")
        verified = self.status == "verified"
        records = (self.verified_date, self.verified_versions, self.verified_by, self.verified_gap)
        if any(verified != (record is not None) for record in records):
            raise ValueError(
                "status verified needs verified_date, verified_versions, verified_by and verified_gap, and only it "
                "may have them"
            )
        if verified and self.unverified_because:
            raise ValueError("a verified entry has no unverified_because")
        return self


def entry_file_name(model: str) -> str:
    """`org--name.yaml` for a Hub id, `local--<folder name>.yaml` for a folder."""
    if Path(model).is_absolute():
        return f"local--{Path(model).name}.yaml"
    return model.replace("/", "--") + ".yaml"


def load_entry(path: Path) -> RegistryEntry:
    try:
        return RegistryEntry.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'entry'}: {err['msg']}" for err in e.errors())
        raise OxrlError(f"{path}: invalid registry entry: {problems}") from None


def write_entry(entry: RegistryEntry, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / entry_file_name(entry.model)
    path.write_text(yaml.safe_dump(entry.model_dump(mode="json"), sort_keys=False))
    return path


def mark_verified(verified: RegistryEntry, folder: Path) -> list[Path]:
    """Mark every entry in `folder` of `verified`'s architecture verified as it was (how the shipped registry is kept:
    an architecture verified on its tiny model verifies the entries of that architecture); their paths."""
    record = verified.model_dump(
        include={"status", "verified_date", "verified_versions", "verified_by", "verified_gap"}
    )
    marked = []
    for path in sorted(folder.glob("*.yaml")):
        entry = load_entry(path)
        if entry.architecture == verified.architecture and entry.model != verified.model:
            marked.append(write_entry(entry.model_copy(update=record | {"unverified_because": None}), folder))
    return marked


def registry_entries(local_dir: Path) -> list[RegistryEntry]:
    """The shipped entries, each replaced by an entry for the same model in `local_dir` (onboarded here)."""
    entries = {e.model: e for e in map(load_entry, sorted(SHIPPED_DIR.glob("*.yaml")))}
    if local_dir.is_dir():
        entries.update({e.model: e for e in map(load_entry, sorted(local_dir.glob("*.yaml")))})
    return list(entries.values())
