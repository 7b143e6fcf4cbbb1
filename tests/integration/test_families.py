"""Every family of the registry through the console script: `oxrl onboard <its tiny model> --verify` (an SFT step, two
RL steps with vLLM rollouts and a refresh, LoRA on the entry's own targets or, for Qwen3-MoE, full weights, the
sampler-trainer gap within its bound), four families in the whole suite and the others in the long lane. The long
lane also runs `oxrl train` SFT and DPO for 2 steps with full weights on each, each family's example
(examples/families/: GRPO, full weights) for 2 steps, and a user's own model of each text architecture, made from
transformers' config class alone with a tokenizer of this test's own, verified the same way (nothing in the verify
path may lean on the tiny models' builders)."""

import json
import math

import pytest
import yaml
from doc_pages import REPO

from oxrl_core.model_registry.schema import load_entry
from oxrl_core.model_registry.verify import GAP_BOUND
from oxrl_core.models.families import FAMILIES
from oxrl_core.models.tiny import resolve_tiny_model

pytestmark = pytest.mark.integration

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
MULTIMODAL = {"oxrl-tiny-qwen2-5-vl", "oxrl-tiny-qwen3-5", "oxrl-tiny-qwen3-5-moe"}


def assert_verified(entry, stdout: str, full_weights: bool = False) -> None:
    assert entry.status == "verified" and entry.verified_date is not None, entry
    assert set(entry.verified_versions) == {"oxrl", "torch", "transformers", "vllm", "deepspeed", "peft"}
    gap, bound = entry.verified_gap, GAP_BOUND[entry.verified_gap["sampler_dtype"]]
    assert gap["checkpoint"] <= bound and gap["refresh"] <= bound, gap
    weights = "full weights" if full_weights else f"LoRA on {', '.join(entry.lora_targets)}"
    assert weights in stdout.replace("\n", " ")
    assert entry.verified_by.endswith(", full weights" if full_weights else ", LoRA"), entry.verified_by


# Gemma 2 (eager attention, its own output layer), Qwen3.5 (bf16 engines on CPU, DeltaNet layers) and both mixtures
# of experts (routed experts, which vLLM's CPU backend keeps in a packed layout of its own that a refresh must
# rebuild, and router replay) run in the whole suite: their trainer and sampler differ most from the default. The
# other families' verifies, 51-59 s each on 2 cores (5.6 minutes together, 2.8 of the whole suite's wall time with
# two workers, measured 2026-12-07), are the long lane's: with them the whole suite took 27.3 minutes, over its 25.
IN_THE_WHOLE_SUITE = {"oxrl-tiny-gemma2", "oxrl-tiny-qwen3-5", "oxrl-tiny-qwen3-moe", "oxrl-tiny-qwen3-5-moe"}
# Qwen3-MoE's RL steps train every weight (its entry's LoRA targets are the attention's alone): its refresh must
# carry each trained expert into the engines' packed layout; the others train LoRA on their entries' targets
FULL_WEIGHTS = {"oxrl-tiny-qwen3-moe"}


@pytest.mark.parametrize(
    "name",
    [name if name in IN_THE_WHOLE_SUITE else pytest.param(name, marks=pytest.mark.slow) for name in FAMILY_MODELS],
)
def test_verify_on_each_family_s_tiny_model_samples_refreshes_and_keeps_the_gap_within_its_bound(oxrl, name, tmp_path):
    # Gemma 2's by its folder, as a user's model is given (its entry is named local--<folder>); the others by name
    model = resolve_tiny_model(name) if name == "oxrl-tiny-gemma2" else name
    full = name in FULL_WEIGHTS
    weights = ["--full-weights"] if full else []
    result = oxrl("onboard", model, "--out", tmp_path, "--verify", *weights, env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    entry = load_entry(tmp_path / (f"local--{name}.yaml" if model != name else f"{name}.yaml"))
    assert_verified(entry, result.stdout, full)
    assert entry.verified_by.startswith(f"{name} ({entry.architecture}, ") and " on CPU, " in entry.verified_by
    if name in ("oxrl-tiny-qwen3-5", "oxrl-tiny-qwen3-5-moe"):  # vLLM's CPU DeltaNet kernel is bf16's only
        assert entry.verified_gap["sampler_dtype"] == "bfloat16" and "the vLLM engines run bfloat16" in result.stdout
        # bf16's own gap here is 1.0e-3; the bound for users' models (real 7Bs: 0.033-0.046) would not see a misplaced
        # weight of a tiny random model (1.6e-2 in float32), so the tiny one is held closer
        assert max(entry.verified_gap["checkpoint"], entry.verified_gap["refresh"]) <= 5e-3, entry.verified_gap
    else:
        assert entry.verified_gap["sampler_dtype"] == "float32"
    # a mixture of experts' steps replayed the engine's routes; float32 engines route as the trainer (a near-tie
    # may flip), bf16's round the router's inputs: 0.992 on the tiny Qwen3.5-MoE (2026-12-07)
    if name in ("oxrl-tiny-qwen3-moe", "oxrl-tiny-qwen3-5-moe"):
        assert entry.verified_gap["routing_agreement"] >= (0.99 if name == "oxrl-tiny-qwen3-moe" else 0.9), entry
    else:
        assert "routing_agreement" not in entry.verified_gap


TWO_STEPS = [
    "train.steps=2",
    "run.train_ranks=1",
    "train.batch_size=8",
    "train.micro_batch_size=4",
    "train.grad_accum=2",
    "data.val=null",
]


# 16 runs of about 40 s on 2 cores, 11 minutes, which the whole suite's 25 do not have; each family's SFT and RL (LoRA)
# steps run through the CLI in its verify above, its DPO step through the rank in test_every_algorithm_steps.py
@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILY_MODELS)
@pytest.mark.parametrize("alg", ["sft", "dpo"])
def test_each_family_trains_two_steps_of_sft_and_dpo_with_full_weights(oxrl, name, alg, tmp_path):
    vlm = name in MULTIMODAL
    config = {"sft": "vlm_sft_tiny" if vlm else "sft_tiny", "dpo": "vlm_dpo_tiny" if vlm else "dpo_tiny"}[alg]
    overrides = [f"model.name_or_path={name}", f"run.output_dir={tmp_path}", "lora.enabled=false", *TWO_STEPS]
    result = oxrl("train", "sl", "--alg", alg, "--config", f"examples/{config}.yaml", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_two_finite_steps(tmp_path)


FAMILY_EXAMPLES = sorted(path.stem for path in (REPO / "examples" / "families").glob("*.yaml"))


# 10 runs of about 45 s (the examples' own settings, 2 steps): about 8 minutes on 2 cores
@pytest.mark.slow
@pytest.mark.parametrize("example", FAMILY_EXAMPLES)
def test_each_family_s_example_trains_two_grpo_steps_with_full_weights_from_refreshed_engines(oxrl, example, tmp_path):
    config = f"examples/families/{example}.yaml"
    result = oxrl("train", "rl", "--config", config, f"run.output_dir={tmp_path}", *TWO_STEPS, "rollout.n_samples=4")
    assert result.returncode == 0, result.stderr[-3000:]
    history = assert_two_finite_steps(tmp_path)
    model = yaml.safe_load((REPO / config).read_text())["model"]["name_or_path"]
    family = next(family for family in FAMILIES if family.tiny_model == model)
    # the engines sample in the family's CPU dtype where vLLM's CPU kernels need one (Qwen3.5's DeltaNet: bf16)
    assert history[1]["logprob_gap_abs"] <= GAP_BOUND[family.cpu_sampler_dtype or "float32"], history


def assert_two_finite_steps(out) -> list[dict]:
    (summary,) = out.glob("*/summary.json")
    history = json.loads(summary.read_text())["history"]
    assert [h["step"] for h in history] == [1, 2] and all(math.isfinite(h["loss"]) for h in history), history
    return history


# A user's own models: the config class of each architecture with small widths (head dims of 64, as vLLM's CPU
# kernels need) and otherwise its defaults, random weights, and a tokenizer of this test's own (a word-level
# vocabulary of the arithmetic tasks' words, `### role` turns ended by `<end>`). Qwen3.5 as its text-only class.
USER_CONFIGS = {
    "llama": {},
    "mistral": {},
    "gemma2": {"query_pre_attn_scalar": 64},
    "gemma3_text": {"query_pre_attn_scalar": 64},
    "phi3": {},
    "qwen3": {},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64},
    "qwen3_5_text": {
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "layer_types": ["linear_attention", "full_attention"],
    },
}
USER_TEMPLATE = (
    "{% for m in messages %}{{ '### ' + m['role'] + '\\n' + m['content'] + '<end>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '### assistant\\n' }}{% endif %}"
)


def build_user_model(model_type: str, folder) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    words = ["###", "user", "assistant", "system", "What", "is", "answer", "<", ">", "</", ">-", "?", "+", "-"]
    vocab = {token: i for i, token in enumerate(["<pad>", "<end>", "<unk>", *words, *"0123456789"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(True)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<end>", pad_token="<pad>", unk_token="<unk>", chat_template=USER_TEMPLATE
    )
    tokenizer.save_pretrained(folder)
    widths = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    config = AutoConfig.for_model(
        model_type,
        **widths,
        intermediate_size=256,
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **USER_CONFIGS[model_type],
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)


# 7 verifies, about 6 minutes on 2 cores; the whole suite verifies each architecture on its tiny model above
@pytest.mark.slow
@pytest.mark.parametrize("model_type", USER_CONFIGS)
def test_a_user_s_own_model_of_each_architecture_verifies_the_same_way(oxrl, model_type, tmp_path):
    folder = tmp_path / f"my-{model_type}"
    build_user_model(model_type, folder)
    result = oxrl("onboard", folder, "--out", tmp_path / "registry", "--verify", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert_verified(load_entry(tmp_path / "registry" / f"local--{folder.name}.yaml"), result.stdout)
