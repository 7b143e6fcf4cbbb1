"""The model scout behind `oxrl onboard`, on tiny local models of several architectures (config files only, no weights)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml
from safetensors import safe_open
from transformers import (
    AutoTokenizer,
    DiffLlamaConfig,
    Gemma2Config,
    LlamaConfig,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen2VLConfig,
)

from oxrl_core.errors import OxrlError
from oxrl_core.model_registry.configs import write_configs
from oxrl_core.model_registry.schema import RegistryEntry, load_entry, write_entry
from oxrl_core.model_registry.scout import recommend_mode, scout
from oxrl_core.resolve.run import resolve_run

REPO = Path(__file__).resolve().parents[2]
TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
)
LANGUAGE_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture
def make_model(tmp_path, tiny_model_dir):
    """A model folder: `config` saved (no weights) beside the tiny model's tokenizer, optionally without its
    chat template or its EOS token."""

    def make(name: str, config_class, template: bool = True, eos: bool = True, **fields) -> Path:
        folder = tmp_path / name
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        ids = dict(
            vocab_size=512, bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
        if "text_config" in fields:  # a multimodal config: the ids belong to its language model
            fields["text_config"] = {**ids, **fields["text_config"]}
        config_class(**ids, **fields).save_pretrained(folder)
        for name in ("tokenizer.json", "tokenizer_config.json", *(["chat_template.jinja"] if template else [])):
            shutil.copy(tiny_model_dir / name, folder)
        if not eos:
            tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
            del tokenizer_config["eos_token"]
            (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
        return folder

    return make


@pytest.mark.parametrize(
    "config_class, architecture, extra",
    [
        (Qwen2Config, "Qwen2ForCausalLM", {}),
        (LlamaConfig, "LlamaForCausalLM", {}),
        (Gemma2Config, "Gemma2ForCausalLM", {"head_dim": 32}),
    ],
)
def test_causal_lms_get_their_facts_a_rendered_template_and_no_findings(make_model, config_class, architecture, extra):
    report = scout(str(make_model("m", config_class, architectures=[architecture], **TEXT, **extra)))
    e = report.entry
    assert (e.architecture, e.model_class, e.context_length, e.vocab_size, e.dtype) == (
        architecture,
        "causal-lm",
        256,
        512,
        "float32",
    )
    assert e.active_params is None and e.chat_template and e.oxrl_trainable and report.vllm_supported
    assert e.lora_targets == LANGUAGE_LINEAR
    assert report.findings == []
    assert report.special_tokens["eos"] == "<|im_end|>"
    assert (
        report.rendered_chat
        == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n<answer>5</answer><|im_end|>\n"
    )


def test_parameter_count_equals_the_tensors_in_the_saved_weights(tiny_model_dir):
    with safe_open(tiny_model_dir / "model.safetensors", "pt") as weights:
        saved = sum(weights.get_tensor(name).numel() for name in weights.keys())
    assert scout(str(tiny_model_dir)).entry.params == saved


def test_moe_active_parameters_leave_out_the_unrouted_experts(make_model):
    moe = dict(moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=1)
    e = scout(str(make_model("moe", Qwen2MoeConfig, architectures=["Qwen2MoeForCausalLM"], **TEXT, **moe))).entry
    # per layer and expert: gate and up (2 x 32 x 64) and down (64 x 32); a token uses 1 expert of 4
    expert = 2 * 32 * 64 + 64 * 32
    assert e.active_params == e.params - 2 * 3 * expert
    assert (
        e.lora_targets == LANGUAGE_LINEAR
    )  # the shared expert's projections; not the router or the shared-expert gate


def test_qwen2_vl_counts_its_vision_tower_targets_only_language_layers_and_trains(make_model):
    vision = dict(depth=1, embed_dim=32, num_heads=2, hidden_size=64)
    report = scout(
        str(
            make_model(
                "vl",
                Qwen2VLConfig,
                architectures=["Qwen2VLForConditionalGeneration"],
                text_config=TEXT,
                vision_config=vision,
            )
        )
    )
    text_only = scout(str(make_model("text", Qwen2Config, architectures=["Qwen2ForCausalLM"], **TEXT))).entry
    e = report.entry
    assert e.model_class == "image-text-to-text" and report.vllm_supported and e.vocab_size == 512
    assert e.params > text_only.params + 32 * 32 * 3  # the vision tower is counted (its attention alone is bigger)
    assert e.lora_targets == LANGUAGE_LINEAR  # not the vision blocks' qkv, proj, fc1, fc2
    assert e.oxrl_trainable and report.findings == []


def test_architecture_vllm_does_not_run_is_a_warning(make_model):
    report = scout(
        str(
            make_model(
                "diff", DiffLlamaConfig, architectures=["DiffLlamaForCausalLM"], **{**TEXT, "num_key_value_heads": 2}
            )
        )
    )
    assert not report.vllm_supported and report.stops == []
    assert [f.text for f in report.findings] == [
        f"vLLM {report.vllm_version} does not support DiffLlamaForCausalLM: RL rollouts need it (SFT works without)"
    ]


def test_no_chat_template_stops_with_the_reason(make_model):
    report = scout(str(make_model("plain", Qwen2Config, template=False, architectures=["Qwen2ForCausalLM"], **TEXT)))
    assert not report.entry.chat_template and report.rendered_chat is None
    assert len(report.stops) == 1 and report.stops[0].startswith("no chat template")


def test_missing_eos_token_stops_with_the_reason(make_model):
    report = scout(str(make_model("no-eos", LlamaConfig, eos=False, architectures=["LlamaForCausalLM"], **TEXT)))
    assert "eos" not in report.special_tokens
    assert len(report.stops) == 1 and report.stops[0].startswith("the tokenizer has no EOS token")


def test_tokenizer_eos_that_generation_does_not_stop_on_is_a_mismatch_warning(make_model):
    # without eos_token, transformers' Qwen2 tokenizer falls back to <|endoftext|>; config.json says <|im_end|>
    report = scout(str(make_model("other-eos", Qwen2Config, eos=False, architectures=["Qwen2ForCausalLM"], **TEXT)))
    assert report.special_tokens["eos"] == "<|endoftext|>" and report.stops == []
    assert [f.text for f in report.findings] == [
        "EOS mismatch: the tokenizer's EOS '<|endoftext|>' (id 0) is not among the ids generation stops on, [2] "
        "(generation_config.json, else config.json)"
    ]


def test_tokenizer_larger_than_the_embedding_stops(make_model):
    folder = make_model("small-vocab", Qwen2Config, architectures=["Qwen2ForCausalLM"], **TEXT)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    assert any("only vocab_size=100" in stop for stop in scout(str(folder)).stops)


def test_malformed_config_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2", ')
    with pytest.raises(OxrlError, match=r"config.json: It looks like the config file .* is not a valid JSON file"):
        scout(str(tmp_path))


def test_unknown_architecture_is_a_clear_error_that_mentions_trust_remote_code(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["NotARealForCausalLM"], "model_type": "not_a_real_model"})
    )
    with pytest.raises(
        OxrlError, match=r"transformers cannot build this model \(.*not_a_real_model.*pass --trust-remote-code"
    ):
        scout(str(tmp_path))


def test_folder_without_config_and_uncached_hub_id_are_clear_errors(tmp_path):
    with pytest.raises(OxrlError, match="folder has no config.json"):
        scout(str(tmp_path))
    with pytest.raises(
        OxrlError, match=r"not-an-org/not-cached: not in the Hugging Face cache, and the Hub cannot be reached"
    ):
        scout("not-an-org/not-cached")


def test_full_finetuning_is_recommended_while_16_bytes_per_param_plus_20_percent_fit():
    assert recommend_mode(4_000_000_000, 80) == "full"  # 76.8 GB
    assert recommend_mode(4_200_000_000, 80) == "lora"  # 80.6 GB
    assert recommend_mode(7_600_000_000, 160) == "full"  # 145.9 GB on two 80 GB GPUs


def test_generated_configs_load_through_the_run_schema(tiny_model_dir, tmp_path, monkeypatch):
    entry = scout(str(tiny_model_dir)).entry
    monkeypatch.chdir(REPO)  # the configs' data paths are relative to the repository root
    for mode in ("full", "lora"):
        sft, rl = write_configs(entry.model_copy(update={"recommended_mode": mode}), False, tmp_path / mode)
        sl_run = resolve_run("sl", sft)  # with LoRA this also checks the targets against the model
        sl_config, rl_config = sl_run.config, resolve_run("rl", rl).config
        assert sl_run.model_path == str(tiny_model_dir)
        assert sl_config.lora.enabled == rl_config.lora.enabled == (mode == "lora")
        assert sl_config.lora.target_modules == LANGUAGE_LINEAR
        assert rl_config.train.alg == "cispo" and rl_config.reward.func == "math"


def test_entry_round_trips_through_its_yaml_file(tiny_model_dir, tmp_path):
    entry = scout(str(tiny_model_dir)).entry
    path = write_entry(entry, tmp_path)
    assert path.name == f"local--{tiny_model_dir.name}.yaml"
    assert load_entry(path) == entry


def test_verified_status_needs_its_date_versions_machine_and_gaps_and_only_it_has_them(tmp_path):
    fields = yaml.safe_load((REPO / "oxrl_core/model_registry/entries/Qwen--Qwen2.5-0.5B-Instruct.yaml").read_text())
    record = {key: fields[key] for key in ("verified_date", "verified_versions", "verified_by", "verified_gap")}
    assert fields["status"] == "verified" and all(record.values())
    needs = "status verified needs verified_date, verified_versions, verified_by and verified_gap"
    for key in record:
        with pytest.raises(ValueError, match=needs):
            RegistryEntry.model_validate({**fields, key: None})
    with pytest.raises(ValueError, match=needs):
        RegistryEntry.model_validate({**fields, "status": "config-ready"})
    with pytest.raises(ValueError, match="a verified entry has no unverified_because"):
        RegistryEntry.model_validate({**fields, "unverified_because": "not yet"})
    verified = RegistryEntry.model_validate(fields)
    assert load_entry(write_entry(verified, tmp_path)) == verified
