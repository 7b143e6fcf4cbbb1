"""Every algorithm, end to end on one step: its example's config resolved, its recipe's batch (data, reference
and old logprobs, advantages, self-play samples and their rewards) and the real rank's train step (loss, backward,
AdamW step) on the tiny model (`one_step_each.py`; one gloo rank, in-process, the vLLM engines replaced by a sampler
that answers half of the samples right). The CLI runs of the pipeline's variants (ZeRO-3, two ranks, vLLM, refresh,
resume) are in test_rl.py, test_sft.py and test_preference.py; this is what proves each loss trains, in seconds."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oxrl_core.algs.registry import ALGORITHMS, RL_ALGS, SL_ALGS
from oxrl_core.cluster.ports import free_port
from oxrl_core.models.tiny import resolve_tiny_model

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("one_step_each.py")
REPO = Path(__file__).resolve().parents[2]
# What each family's step reports besides loss, grad_norm and lr: the recipe's and the loss's own metrics.
RL_METRICS = {"accuracy", "reward_mean", "entropy", "clip_frac", "logprob_gap_kl", "policy_version", "response_length"}
PAIR_METRICS = {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"}
OWN_METRICS = {
    "ppo": {"value_loss"},
    "grpo": {"kl_ref"},
    "sgrpo": {"kl_ref"},
    "dapo": {"groups_dropped"},
    "sft": {"nll"},
    "cpt": {"nll"},
    "kd": {"nll", "kl"},
    "rft": {"nll", "rft_kept"},
    "kto": {"kl_baseline", "rewards/desirable", "rewards/undesirable"},
    "orpo": PAIR_METRICS | {"log_odds_chosen"},
    "dpo": PAIR_METRICS,
    "ipo": PAIR_METRICS,
    "simpo": PAIR_METRICS,
    "rm": PAIR_METRICS,
    "spin": PAIR_METRICS,
    "online-dpo": PAIR_METRICS | {"reward_mean", "tied_prompts_frac"},
}


def one_step_each(out: Path, model: Path | str, steps: list[str]) -> dict:
    """`one_step_each.py`'s results for `steps` (its STEP arguments, bare algorithms on `model`), by STEP."""
    rank = subprocess.run(
        [sys.executable, str(SCRIPT), str(model), str(out), str(free_port()), *steps],
        cwd=REPO,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rank.returncode == 0, rank.stderr[-4000:]
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def steps(tmp_path_factory, tiny_model_dir) -> dict:
    return one_step_each(tmp_path_factory.mktemp("one-step"), tiny_model_dir, [*RL_ALGS, *SL_ALGS])


@pytest.mark.parametrize("alg", [*RL_ALGS, *SL_ALGS])
def test_each_algorithm_takes_an_optimizer_step_from_its_example_with_its_metrics(steps, alg):
    step, algorithm = steps[alg], ALGORITHMS[alg]
    metrics = step["metrics"]
    assert math.isfinite(metrics["loss"]), metrics
    assert 0 < metrics["grad_norm"] < math.inf, metrics
    # AdamW's first step moves each weight by at most lr, and by lr where its gradient is far above eps
    assert step["weights_moved"] == pytest.approx(metrics["lr"], rel=0.05), metrics
    expected = (RL_METRICS if algorithm.loop == "rl" else set()) | OWN_METRICS.get(alg, set())
    assert expected <= metrics.keys(), f"{alg} lacks {sorted(expected - metrics.keys())}"
    if algorithm.loop == "rl":
        # half of each group's samples answer right: the reward reached every sample, and each group varies
        assert metrics["accuracy"] == 0.5 and metrics["policy_version"] == 1, metrics
    if algorithm.dynamic_sampling:
        assert metrics["groups_dropped"] == 0 and metrics["sampling_rounds"] == 1, metrics
    if algorithm.self_play in ("passing", "best-over-worst"):
        assert metrics.get("rft_reward_mean", metrics.get("reward_mean")) == 0.5, metrics


# Each multimodal family's trainer side on its examples' records (the squares task's images, the beeps task's clips):
# processor, encoder, placeholders and position ids under each loop's loss. Their vLLM models are checked against the
# trainer after a refresh in test_vlm.py (Qwen2-VL's and Qwen2-Audio's in the whole suite).
MEDIA_FAMILIES = {
    "qwen2_vl": ("vlm", "tiny_vl_model_dir"),
    "qwen3_vl": ("vlm", "tiny_qwen3_vl_model_dir"),
    "smolvlm": ("vlm", "tiny_smolvlm_model_dir"),
    "qwen2_audio": ("audio", "tiny_audio_model_dir"),
}
MEDIA_ALGS = ("sft", "dpo", "cispo")


@pytest.fixture(scope="module")
def media_steps(tmp_path_factory, request) -> dict:
    entries = {
        (family, alg): f"{alg}:{prefix}_{alg}_tiny:{request.getfixturevalue(model)}"
        for family, (prefix, model) in MEDIA_FAMILIES.items()
        for alg in MEDIA_ALGS
    }
    # each step names its model: none is a bare algorithm
    results = one_step_each(tmp_path_factory.mktemp("one-step-media"), "unused", list(entries.values()))
    return {key: results[entry] for key, entry in entries.items()}


@pytest.mark.parametrize("family", MEDIA_FAMILIES)
@pytest.mark.parametrize("alg", MEDIA_ALGS)
def test_each_multimodal_family_takes_an_optimizer_step_on_its_media_with_each_loop(media_steps, family, alg):
    step = media_steps[family, alg]
    metrics = step["metrics"]
    assert step["trained_on_media"], f"{family} {alg}: no micro-batch carried the images or clips"
    assert math.isfinite(metrics["loss"]) and 0 < metrics["grad_norm"] < math.inf, metrics
    assert step["weights_moved"] == pytest.approx(metrics["lr"], rel=0.05), metrics
    if alg == "cispo":
        assert metrics["accuracy"] == 0.5 and metrics["policy_version"] == 1, metrics


# Each text and hybrid family of the registry (models/families/) under a preference loss: its template
# renders the examples' records, its masks, its model class under the rank's forward (packed where it packs), its
# LoRA-free full-weight step. The vLLM side of each is `oxrl onboard --verify` (tests/integration/test_families.py).
FAMILY_MODELS = {
    "oxrl-tiny-llama": "",
    "oxrl-tiny-mistral": "",
    "oxrl-tiny-gemma2": "",
    "oxrl-tiny-gemma3": "",
    "oxrl-tiny-phi3": "",
    "oxrl-tiny-qwen3": "",
    "oxrl-tiny-qwen3-moe": "",
    "oxrl-tiny-qwen2-5-vl": "vlm_",
    "oxrl-tiny-qwen3-5": "vlm_",
    "oxrl-tiny-qwen3-5-moe": "vlm_",
}
FAMILY_ALGS = ("dpo",)  # their RL step with vLLM: `oxrl onboard --verify` (test_families.py)


MIXTURES_OF_EXPERTS = {"oxrl-tiny-qwen3-moe": 2, "oxrl-tiny-qwen3-5-moe": 2}  # each one's layers
HEAVY_BALANCING = 1000.0  # the load-balancing loss's weight in a copy of the tiny Qwen3-MoE's config (its own: 0.001)


def heavy_balancing_copies(out: Path) -> dict[bool, Path]:
    """The tiny Qwen3-MoE with its load-balancing loss weighted HEAVY_BALANCING, twice (a run folder each): the step
    with model.router_aux_loss off (key False) and on (True)."""
    source = Path(resolve_tiny_model("oxrl-tiny-qwen3-moe"))
    copies = {on: out / f"heavy-balancing-{'on' if on else 'off'}" for on in (False, True)}
    for copy in copies.values():
        shutil.copytree(source, copy)
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps(config | {"router_aux_loss_coef": HEAVY_BALANCING}))
    return copies


@pytest.fixture(scope="module")
def family_steps(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("one-step-families")
    entries = {
        (model, alg): f"{alg}:{prefix}{alg}_tiny:{resolve_tiny_model(model)}"
        for model, prefix in FAMILY_MODELS.items()
        for alg in FAMILY_ALGS
    }
    entries |= {
        ("heavy-balancing", on): f"dpo:dpo_tiny:{path}:model.router_aux_loss={str(on).lower()}"
        for on, path in heavy_balancing_copies(out).items()
    }
    results = one_step_each(out, "unused", list(entries.values()))
    return {key: results[entry] for key, entry in entries.items()}


@pytest.mark.parametrize("model", FAMILY_MODELS)
@pytest.mark.parametrize("alg", FAMILY_ALGS)
def test_each_family_takes_a_preference_step_through_the_rank(family_steps, model, alg):
    step = family_steps[model, alg]
    metrics = step["metrics"]
    assert math.isfinite(metrics["loss"]) and 0 < metrics["grad_norm"] < math.inf, metrics
    assert step["weights_moved"] == pytest.approx(metrics["lr"], rel=0.05), metrics
    assert PAIR_METRICS <= metrics.keys(), metrics
    assert step["trained_on_media"] == (FAMILY_MODELS[model] == "vlm_")


@pytest.mark.parametrize("model", MIXTURES_OF_EXPERTS)
def test_a_mixture_of_experts_step_reports_each_layers_expert_load_and_its_load_balancing_loss(family_steps, model):
    step = family_steps[model, "dpo"]
    metrics, layers = step["metrics"], MIXTURES_OF_EXPERTS[model]
    [load] = step["expert_load"]  # one step: one line of tokens per expert, [layer][expert]
    tokens = load["tokens_per_expert"]
    assert load["step"] == 1 and len(tokens) == layers and all(len(row) == 8 for row in tokens)
    # every layer routes the same tokens, 2 choices each (top-2), to 2 different experts
    assert len({sum(row) for row in tokens}) == 1 and sum(tokens[0]) % 2 == 0 and sum(tokens[0]) > 0
    for i, row in enumerate(tokens):
        assert metrics[f"expert_load_max_over_mean/layer_{i}"] == pytest.approx(max(row) / (sum(row) / 8))
    assert 1 <= metrics["expert_load_max_over_mean"] <= 8 / 2
    assert metrics["expert_load_max_over_mean"] == pytest.approx(
        sum(metrics[f"expert_load_max_over_mean/layer_{i}"] for i in range(layers)) / layers
    )
    # Switch's loss, E * sum_e f_e P_e with f_e the share of the k choices: k (2) where the router is uniform, as the
    # tiny random routers nearly are
    assert metrics["router_aux_loss"] == pytest.approx(2, rel=0.1), metrics


def test_the_load_balancing_loss_trains_the_router_only_when_asked(family_steps):
    off, on = family_steps["heavy-balancing", False]["metrics"], family_steps["heavy-balancing", True]["metrics"]
    # the same forward: the same routing and loss, measured either way
    assert on["router_aux_loss"] == pytest.approx(off["router_aux_loss"], rel=1e-6)
    assert on["loss"] == pytest.approx(off["loss"], rel=1e-6)  # the algorithm's loss; the balancing term apart
    # weighted 1000-fold, its gradient outweighs DPO's: off, the step's gradient is DPO's alone
    assert on["grad_norm"] > 2 * off["grad_norm"], (on["grad_norm"], off["grad_norm"])
