"""`oxrl merge-lora` on the tiny model: peft adapters made here, merged, checked, refused."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, LoraModel, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from oxrl_core.errors import OxrlError
from oxrl_core.models.merge import merge_adapter

R, ALPHA = 8, 16.0
TARGETS = ["q_proj", "v_proj", "up_proj"]
WIDE = {"COLUMNS": "250"}  # rich wraps table cells to the terminal's width


def save_adapter(base_dir: Path, folder: Path, task_type: str = "CAUSAL_LM") -> Path:
    """A LoRA adapter saved by peft itself, as any peft user saves one, with seeded non-zero B (peft starts B at zero)."""
    torch.manual_seed(0)
    if task_type == "SEQ_CLS":
        model = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=1, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type=task_type))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory) -> Path:
    return save_adapter(tiny_model_dir, tmp_path_factory.mktemp("adapter") / "lora")


def with_recorded_base(adapter: Path, folder: Path, recorded: str) -> Path:
    """A copy of the adapter whose adapter_config.json names another base."""
    shutil.copytree(adapter, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": recorded}))
    return folder


def save_base(model, tiny_model_dir: Path, folder: Path) -> str:
    """Another base model beside the tiny one, with the tiny tokenizer."""
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return str(folder)


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


def test_merged_folder_has_the_bases_tensor_names_in_shards_and_gives_the_adapter_applied_logits(
    tiny_model_dir, adapter, tmp_path
):
    out = tmp_path / "merged"
    out.mkdir()  # an empty folder is a fine destination
    report = merge_adapter(adapter, out, max_shard_size="200KB")
    assert report.lora_layers == 6 and report.task_type == "CAUSAL_LM" and report.base == str(tiny_model_dir)
    assert report.max_logit_diff is not None and report.max_logit_diff <= 1e-4

    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    merged_state = {name: t for shard in shards for name, t in load_file(shard).items()}
    assert not [n for n in merged_state if "base_model.model." in n or ".base_layer" in n or "lora_" in n]
    assert merged_state.keys() == load_file(tiny_model_dir / "model.safetensors").keys()  # plain names, no tensor lost

    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True)[
        "input_ids"
    ]
    assert (
        ids
        == AutoTokenizer.from_pretrained(tiny_model_dir).apply_chat_template(
            [{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True
        )["input_ids"]
    )
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    base_logits = logits(base, ids)
    applied = logits(PeftModel.from_pretrained(base, adapter).eval(), ids)
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert (logits(merged, ids) - applied).abs().max() <= 1e-4
    assert (applied - base_logits).abs().max() > 1e-2  # the adapter changes the model: the comparison could fail


def test_merged_weight_is_w_plus_alpha_over_r_times_b_a(tiny_model_dir, adapter, tmp_path):
    merge_adapter(adapter, tmp_path / "merged")
    name = "model.layers.1.mlp.up_proj"
    a = load_file(adapter / "adapter_model.safetensors")
    lora_a = a[f"base_model.model.{name}.lora_A.weight"].double()  # [r, in]
    lora_b = a[f"base_model.model.{name}.lora_B.weight"].double()  # [out, r]
    w = load_file(tiny_model_dir / "model.safetensors")[f"{name}.weight"].double()  # [out, in]
    merged = load_file(tmp_path / "merged" / "model.safetensors")[f"{name}.weight"]
    expected = [
        [
            w[i, j].item() + ALPHA / R * sum(lora_b[i, k].item() * lora_a[k, j].item() for k in range(R))
            for j in range(0, w.shape[1], 17)
        ]
        for i in range(0, w.shape[0], 23)
    ]
    assert torch.allclose(merged[::23, ::17].double(), torch.tensor(expected, dtype=torch.float64), atol=1e-6)


def test_dtype_casts_the_written_weights_and_the_config(adapter, tmp_path):
    report = merge_adapter(adapter, tmp_path / "merged", dtype="bfloat16")
    assert report.dtype == "bfloat16"
    assert {t.dtype for t in load_file(tmp_path / "merged" / "model.safetensors").values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["dtype"] == "bfloat16"
    assert merge_adapter(adapter, tmp_path / "auto").dtype == "float32"  # auto: the tiny base's own dtype


def test_the_tokenizer_in_the_adapter_folder_wins_over_the_bases(tiny_model_dir, adapter, tmp_path):
    own = tmp_path / "with-tokenizer"
    shutil.copytree(adapter, own)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # as oxrl saves a run's tokenizer: beside the adapter
    )
    tokenizer.save_pretrained(own)
    report = merge_adapter(own, tmp_path / "merged")
    assert report.tokenizer_from == str(own)
    assert AutoTokenizer.from_pretrained(tmp_path / "merged").chat_template == tokenizer.chat_template


def test_a_seq_cls_adapter_merges_into_a_sequence_classifier(tiny_model_dir, tmp_path):
    rm_adapter = save_adapter(
        tiny_model_dir, tmp_path / "rm-lora", task_type="SEQ_CLS"
    )  # as `--alg rm` with LoRA saves
    report = merge_adapter(rm_adapter, tmp_path / "merged")
    assert report.task_type == "SEQ_CLS" and report.max_logit_diff <= 1e-4
    base = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1, dtype=torch.float32)
    applied = PeftModel.from_pretrained(base, rm_adapter).eval()
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    ids = AutoTokenizer.from_pretrained(tiny_model_dir)("What is 3 + 4? <answer>7</answer>")["input_ids"]
    assert logits(merged, ids).shape == (1, 1)
    assert (logits(merged, ids) - logits(applied, ids)).abs().max() <= 1e-4


def test_a_wrong_merge_is_refused_and_leaves_nothing_behind(adapter, tmp_path, monkeypatch):
    # unload() drops the adapter without merging it: the logits check must catch that
    monkeypatch.setattr(LoraModel, "merge_and_unload", lambda self: self.unload())
    with pytest.raises(
        OxrlError, match=r"merged logits differ from the adapter-applied ones by .* > --atol 0.0001; nothing written"
    ):
        merge_adapter(adapter, tmp_path / "merged")
    assert list(tmp_path.iterdir()) == []
    assert merge_adapter(adapter, tmp_path / "unchecked", check=False).max_logit_diff is None  # --no-check skips it


WRONG_BASES = {
    # another hidden size: the adapter's tensors do not fit; the error names one and both shapes
    "qwen2-hidden64": (
        Qwen2Config,
        Qwen2ForCausalLM,
        {"hidden_size": 64, "num_attention_heads": 1},
        r"adapter tensor base_model\.model\.model\.layers\.\d\.\S+\.lora_A\.weight has shape \[8, 128\], "
        r"base .*qwen2-hidden64 \(model_type 'qwen2'\) needs \[8, 64\]",
    ),
    # a Llama of the tiny model's sizes has the same module names and shapes: only the recorded base can tell
    "llama": (
        LlamaConfig,
        LlamaForCausalLM,
        {"hidden_size": 128, "num_attention_heads": 2},
        r"--base .*llama: model_type 'llama' \['LlamaForCausalLM'\], but .* was trained on "
        r".*: model_type 'qwen2' \['Qwen2ForCausalLM'\]",
    ),
}


@pytest.mark.parametrize("name", WRONG_BASES)
def test_a_base_of_another_size_or_model_type_is_refused_and_nothing_is_written(
    name, tiny_model_dir, adapter, tmp_path
):
    config_class, model_class, sizes, message = WRONG_BASES[name]
    config = config_class(
        vocab_size=len(AutoTokenizer.from_pretrained(tiny_model_dir)),
        num_hidden_layers=2,
        num_key_value_heads=1,
        intermediate_size=256,
        tie_word_embeddings=True,
        **sizes,
    )
    wrong = save_base(model_class(config), tiny_model_dir, tmp_path / name)
    with pytest.raises(OxrlError, match=message):
        merge_adapter(adapter, tmp_path / "merged", base=wrong)
    assert not (tmp_path / "merged").exists()


def test_without_the_recorded_base_a_base_lacking_the_target_modules_is_refused(tiny_model_dir, adapter, tmp_path):
    moved = with_recorded_base(adapter, tmp_path / "moved", "/no/such/base")
    with pytest.raises(
        OxrlError, match=r"base_model_name_or_path \(pass --base to use another\): .*'/no/such/base': no such folder"
    ):
        merge_adapter(moved, tmp_path / "merged")
    config = GPT2Config(vocab_size=len(AutoTokenizer.from_pretrained(tiny_model_dir)), n_embd=128, n_layer=2, n_head=2)
    gpt2 = save_base(
        GPT2LMHeadModel(config), tiny_model_dir, tmp_path / "gpt2"
    )  # c_attn, c_fc: no q_proj, v_proj, up_proj
    with pytest.raises(
        OxrlError,
        match=r"its target modules \['q_proj', 'up_proj', 'v_proj'\] do not fit base .*gpt2 "
        r"\(model_type 'gpt2'\)",
    ):
        merge_adapter(moved, tmp_path / "merged", base=gpt2)
    assert (
        merge_adapter(moved, tmp_path / "merged", base=str(tiny_model_dir)).max_logit_diff <= 1e-4
    )  # the right one is taken


def test_folders_that_are_not_adapters_and_an_occupied_out_are_refused(tiny_model_dir, adapter, tmp_path):
    with pytest.raises(OxrlError, match="no such folder; give a PEFT adapter folder"):
        merge_adapter(tmp_path / "missing", tmp_path / "merged")
    with pytest.raises(OxrlError, match=r"not a PEFT adapter folder \(a full model \(config.json\), not an adapter\)"):
        merge_adapter(tiny_model_dir, tmp_path / "merged")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    with pytest.raises(OxrlError, match="--out .*occupied: already exists and is not an empty folder"):
        merge_adapter(adapter, occupied)
    assert [p.name for p in occupied.iterdir()] == ["keep.txt"]
    with pytest.raises(OxrlError, match=r"--dtype 'float8': .*allowed: auto, float32, bfloat16, float16"):
        merge_adapter(adapter, tmp_path / "merged", dtype="float8")
    with pytest.raises(OxrlError, match=r"--max-shard-size 'big': not a size"):
        merge_adapter(adapter, tmp_path / "merged", max_shard_size="big")
    assert not (tmp_path / "merged").exists()


def test_console_script_merges_with_the_given_base_and_dtype_and_reports_it(oxrl, tiny_model_dir, adapter, tmp_path):
    result = oxrl(
        "merge-lora", adapter, "--out", tmp_path / "merged", "--base", tiny_model_dir, "--dtype", "bfloat16", env=WIDE
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "CAUSAL_LM, 6 LoRA layers" in result.stdout and "max |merged - adapter-applied| logit" in result.stdout
    assert "bfloat16" in result.stdout and "model.safetensors" in result.stdout
    assert {t.dtype for t in load_file(tmp_path / "merged" / "model.safetensors").values()} == {torch.bfloat16}


FAMILY_MODELS = [
    "oxrl-tiny-llama",
    "oxrl-tiny-mistral",
    "oxrl-tiny-gemma2",
    "oxrl-tiny-gemma3",
    "oxrl-tiny-phi3",
    "oxrl-tiny-qwen3",
    "oxrl-tiny-qwen3-moe",
    "oxrl-tiny-qwen2-5-vl",
    "oxrl-tiny-qwen3-5",
    "oxrl-tiny-qwen3-5-moe",
]


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_each_family_s_adapter_on_its_registry_targets_merges_into_the_adapter_applied_logits(name, tmp_path):
    """On the targets `oxrl onboard` writes into the family's entry (Phi-3's fused qkv_proj and gate_up_proj,
    Qwen3.5's DeltaNet projections), the merged model is the adapter-applied one."""
    from transformers import AutoModelForMultimodalLM

    from oxrl_core.model_registry.scout import scout
    from oxrl_core.models.tiny import resolve_tiny_model

    base_dir = resolve_tiny_model(name)
    targets = scout(str(base_dir)).entry.lora_targets
    auto = (
        AutoModelForMultimodalLM
        if name in ("oxrl-tiny-qwen2-5-vl", "oxrl-tiny-qwen3-5", "oxrl-tiny-qwen3-5-moe")
        else AutoModelForCausalLM
    )
    torch.manual_seed(0)
    model = get_peft_model(
        auto.from_pretrained(base_dir, dtype=torch.float32), LoraConfig(r=R, lora_alpha=ALPHA, target_modules=targets)
    )
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "lora_B" in param_name:
                param.normal_(std=0.05)
    model.save_pretrained(tmp_path / "lora")
    report = merge_adapter(tmp_path / "lora", tmp_path / "merged")
    ids = AutoTokenizer.from_pretrained(base_dir)("What is 3 + 4? <answer>7</answer>")["input_ids"]
    applied, merged = logits(model.eval(), ids), logits(auto.from_pretrained(tmp_path / "merged"), ids)
    base = logits(auto.from_pretrained(base_dir, dtype=torch.float32), ids)
    assert report.max_logit_diff is not None and report.max_logit_diff <= 1e-4  # merge_adapter's own check
    assert (merged - applied).abs().max() <= 1e-4 and (applied - base).abs().max() > 1e-2
