"""The shipped registry: every entry validates, is named after its model, and follows the documented rules."""

import json
from datetime import date
from pathlib import Path

import pytest
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from oxrl_core.data.media import MEDIA_MODEL_TYPES
from oxrl_core.model_registry.schema import SHIPPED_DIR, entry_file_name, load_entry, registry_entries, write_entry
from oxrl_core.model_registry.scout import HUB_ID, recommend_mode

ENTRY_FILES = sorted(SHIPPED_DIR.glob("*.yaml"))
# The models the registry promises.
PROMISED = {
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen/Qwen2.5-3B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "Qwen/Qwen2.5-Coder-7B-Instruct",
    "Qwen/Qwen2.5-Math-1.5B-Instruct",
    "Qwen/Qwen2.5-Math-7B-Instruct",
    "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-4B",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3.5-27B",
    "Qwen/Qwen3.5-35B-A3B",
    "Qwen/Qwen3-30B-A3B",
    "google/gemma-2-2b-it",
    "google/gemma-3-1b-it",
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.2-1B-Instruct",
    "meta-llama/Llama-3.2-3B-Instruct",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "microsoft/Phi-3.5-mini-instruct",
    "microsoft/phi-4",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
    "Qwen/Qwen2-VL-2B-Instruct",
    "Qwen/Qwen2-VL-7B-Instruct",
    "Qwen/Qwen2.5-VL-3B-Instruct",
    "Qwen/Qwen2.5-VL-7B-Instruct",
    "Qwen/Qwen3-VL-2B-Instruct",
    "Qwen/Qwen3-VL-4B-Instruct",
    "HuggingFaceTB/SmolVLM-Instruct",
    "Qwen/Qwen2-Audio-7B-Instruct",
}


@pytest.mark.parametrize("path", ENTRY_FILES, ids=lambda p: p.stem)
def test_shipped_entry_validates_and_is_named_after_its_hub_id(path: Path):
    entry = load_entry(path)
    assert HUB_ID.match(entry.model)
    assert path.name == entry_file_name(entry.model) == entry.model.replace("/", "--") + ".yaml"
    # verified by `oxrl onboard <its family's tiny model> --verify --mark-registry`, or it says in a line why not
    assert (entry.status == "verified") != bool(entry.unverified_because)


@pytest.mark.parametrize("path", ENTRY_FILES, ids=lambda p: p.stem)
def test_shipped_entry_follows_the_full_vs_lora_rule_and_the_trainer_s_model_classes(path: Path):
    entry = load_entry(path)
    assert entry.recommended_mode == recommend_mode(entry.params, entry.gpu_memory_gb)
    assert entry.oxrl_trainable == (
        entry.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or entry.model_type in MEDIA_MODEL_TYPES
    )
    assert (entry.active_params is not None) == ("moe" in entry.model_type)


def test_registry_ships_every_promised_model():
    assert PROMISED <= {load_entry(path).model for path in ENTRY_FILES}


def test_an_entry_onboarded_here_replaces_the_shipped_one_in_the_listing(tmp_path):
    shipped = load_entry(SHIPPED_DIR / "Qwen--Qwen2.5-0.5B-Instruct.yaml")
    record = {"verified_date": date(2026, 11, 3), "verified_versions": {"oxrl": "0.1.0"}, "verified_by": "a GPU"}
    verified = shipped.model_copy(
        update={"status": "verified", **record, "verified_gap": {"checkpoint": 1e-6}, "unverified_because": None}
    )
    write_entry(verified, tmp_path)
    listed = registry_entries(tmp_path)
    assert len(listed) == len(ENTRY_FILES)
    assert [e for e in listed if e.model == shipped.model] == [verified]


def test_each_entry_names_its_family_s_tiny_model_of_its_class_and_was_verified_on_it():
    """The registry and the tiny models in step: an entry of an architecture without a tiny model (a new family)
    fails here until its family's module exists, or the entry says why it is not verified."""
    from oxrl_core.models.families import family_of
    from oxrl_core.models.tiny import resolve_tiny_model

    for path in ENTRY_FILES:
        entry = load_entry(path)
        family = family_of(entry.model_type)
        if family is None:
            assert entry.unverified_because and entry.tiny_model is None, entry.model
            continue
        config = json.loads((resolve_tiny_model(family.tiny_model) / "config.json").read_text())
        assert entry.tiny_model == family.tiny_model and config["architectures"] == [entry.architecture], entry.model
        assert entry.verified_by.startswith(f"{family.tiny_model} ({entry.architecture}, "), entry.model


def test_every_family_has_an_example_on_its_tiny_model_naming_its_smallest_entry_and_its_lora_targets():
    """A user who picks a family finds a recipe to start from: examples/ (the Qwen2 families') or
    examples/families/, on the family's tiny model, its comment giving the smallest registry entry of the
    architecture and that entry's LoRA targets."""
    import yaml

    from oxrl_core.models.families import FAMILIES

    examples = Path(__file__).parents[2] / "examples"
    models = lambda paths: {yaml.safe_load(p.read_text())["model"]["name_or_path"]: p for p in paths}  # noqa: E731
    shipped, per_family = models(examples.glob("*.yaml")), models((examples / "families").glob("*.yaml"))
    entries = [load_entry(path) for path in ENTRY_FILES]
    for family in FAMILIES:
        if family.tiny_model in shipped:
            continue
        text = per_family.pop(family.tiny_model).read_text()
        ours = [e for e in entries if e.model_type in family.model_types]
        smallest = min(ours, key=lambda e: e.params)
        comment = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
        assert f"model.name_or_path={smallest.model}," in comment, family.tiny_model
        assert f"target_modules: [{', '.join(smallest.lora_targets)}]" in comment, family.tiny_model
    assert not per_family, f"examples of no family: {sorted(per_family)}"
