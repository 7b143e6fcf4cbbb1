"""Preference, distillation, reward-model and continued-pretraining runs on the real stack.

Each shipped example config (`examples/<alg>_tiny.yaml`, the tiny model on the seeded
synthetic sets) runs for 2 steps through the `oxrl` console script, and its own metric on
the held-out file moves the right way between the evaluation before training and after.
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

pytestmark = pytest.mark.integration


def run_example(oxrl, alg, tiny_model_dir, out, *overrides):
    result = oxrl("train", "sl", "--config", f"examples/{alg}_tiny.yaml", f"model.name_or_path={tiny_model_dir}",
                  "train.steps=2", f"run.output_dir={out}", f"run.name={alg}", *overrides)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out / alg / "summary.json").read_text())


@pytest.mark.parametrize("alg", ["dpo", "ipo", "simpo", "orpo"])
def test_preference_example_raises_reward_accuracy_and_margin(oxrl, tiny_model_dir, tmp_path, alg):
    summary = run_example(oxrl, alg, tiny_model_dir, tmp_path)
    before, after = summary["eval_before"], summary["eval_after"]
    assert after["eval_rewards/accuracies"] > before["eval_rewards/accuracies"]
    assert after["eval_rewards/margins"] > before["eval_rewards/margins"]
    assert after["eval_rewards/chosen"] > after["eval_rewards/rejected"]
    assert len(summary["history"]) == 2 and summary["history"][1]["loss"] < summary["history"][0]["loss"]


def test_dpo_with_a_reference_model_matches_precomputed_reference_logprobs(oxrl, tiny_model_dir, tmp_path):
    """The dpo example runs ZeRO-3 on 2 ranks; the frozen reference model gives the same steps as precomputed sums."""
    precomputed = run_example(oxrl, "dpo", tiny_model_dir, tmp_path / "pre")
    with_model = run_example(oxrl, "dpo", tiny_model_dir, tmp_path / "model", "train.reference=model")
    for a, b in zip(precomputed["history"], with_model["history"]):
        for key in ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(a[key])), key
    assert (tmp_path / "pre" / "dpo" / "reference_logps.pt").is_file()
    assert not (tmp_path / "model" / "dpo" / "reference_logps.pt").exists()


def test_kto_example_widens_the_desirable_undesirable_margin(oxrl, tiny_model_dir, tmp_path):
    summary = run_example(oxrl, "kto", tiny_model_dir, tmp_path)
    before, after = summary["eval_before"], summary["eval_after"]
    assert after["eval_rewards/margins"] > before["eval_rewards/margins"]
    assert after["eval_rewards/desirable"] > 0 > after["eval_rewards/undesirable"]
    assert summary["history"][0]["kl_baseline"] == pytest.approx(0.0, abs=1e-4)  # the policy starts as the reference


def test_cpt_example_lowers_the_held_out_language_model_loss(oxrl, tiny_model_dir, tmp_path):
    summary = run_example(oxrl, "cpt", tiny_model_dir, tmp_path)
    assert summary["eval_after"]["eval_loss"] < summary["eval_before"]["eval_loss"]


@pytest.fixture(scope="module")
def other_tiny_model(tiny_model_dir, tmp_path_factory):
    """The tiny model's architecture and tokenizer with other random weights: a teacher to distil from."""
    folder = tmp_path_factory.mktemp("teacher")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.5)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return folder


def test_kd_example_brings_the_student_closer_to_the_teacher(oxrl, tiny_model_dir, other_tiny_model, tmp_path):
    summary = run_example(oxrl, "kd", tiny_model_dir, tmp_path, f"train.teacher={other_tiny_model}")
    assert summary["eval_after"]["eval_kl"] < summary["eval_before"]["eval_kl"]


def test_kd_refuses_a_teacher_with_another_tokenizer(oxrl, tiny_model_dir, tmp_path):
    teacher = tmp_path / "teacher"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(teacher)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(teacher)
    result = oxrl("train", "sl", "--config", "examples/kd_tiny.yaml", f"model.name_or_path={tiny_model_dir}",
                  f"train.teacher={teacher}", f"run.output_dir={tmp_path}")
    assert result.returncode == 2
    assert "train.teacher=" in result.stderr and "tokenizer differs" in result.stderr and "'<extra>'" in result.stderr


@pytest.fixture(scope="module")
def reward_model_run(oxrl, tiny_model_dir, tmp_path_factory):
    # seed 2 draws a scalar head that starts out ranking every held-out pair the wrong way round
    return run_example(oxrl, "rm", tiny_model_dir, tmp_path_factory.mktemp("rm"), "train.seed=2")


def test_rm_example_learns_to_rank_chosen_above_rejected(reward_model_run):
    before, after = reward_model_run["eval_before"], reward_model_run["eval_after"]
    assert before["eval_rewards/accuracies"] < 0.5 < after["eval_rewards/accuracies"]
    assert after["eval_rewards/margins"] > before["eval_rewards/margins"]


def test_rm_final_folder_is_a_sequence_classifier_giving_the_trainers_scores(reward_model_run, tiny_model_dir):
    final = reward_model_run["checkpoint"]
    model = AutoModelForSequenceClassification.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert model.config.num_labels == 1 and model.config.pad_token_id == tokenizer.pad_token_id
    pairs = [json.loads(line) for line in open("examples/data/arithmetic_pref_val.jsonl")]
    correct = 0
    for pair in pairs:
        scores = []
        for side in ("chosen", "rejected"):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": pair["prompt"]},
                                                 {"role": "assistant", "content": pair[side]}], return_tensors="pt",
                                                return_dict=True)
            with torch.no_grad():
                scores.append(model(**ids).logits[0, 0].item())
        correct += scores[0] > scores[1]
    assert correct / len(pairs) == pytest.approx(reward_model_run["eval_after"]["eval_rewards/accuracies"])
