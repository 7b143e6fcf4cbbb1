"""Every loop once on one GPU, through the CLI, on the tiny model in bf16: what the CPU suite cannot reach (CUDA IPC
weight refresh, colocated vLLM + DeepSpeed, NCCL, the Triton logprobs kernels). Skipped without CUDA; run on a lent
GPU machine with `bash tests/gpu/run.sh` and record the result in tests/gpu/RESULTS.md."""

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from oxrl_core.preprocess.arithmetic import arithmetic_problems, write_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
# vLLM (bf16, its own kernels) against the trainer (bf16, the Triton logprobs kernels) on the same tokens, right after
# a refresh: the mean |difference| per token. A missed refresh after a step at lr 1e-2 is an order of magnitude larger.
BF16_LOGPROB_GAP = 0.05
# The CPU suite's test reward (share of digits in the response): signal even from random weights, which the math
# reward (all zero) would not give.
TEST_REWARD = {
    "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1] / "integration"), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
}


def history(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "summary.json").read_text())["history"]


def rl(alg: str, tiny_model_dir, out: Path, name: str, *overrides: str) -> list[str]:
    """Three steps at a large learning rate on the CPU suite's test reward (run with env=TEST_REWARD)."""
    return [
        "train",
        "rl",
        "--alg",
        alg,
        "--config",
        f"examples/{alg}_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        f"run.output_dir={out}",
        f"run.name={name}",
        "train.steps=3",
        "train.lr=1e-2",
        "train.batch_size=32",
        "train.grad_accum=2",
        "data.val=null",
        "reward.func=rl_test_rewards:digit_share",
        *overrides,
    ]


def sl(alg: str, tiny_model_dir, out: Path, name: str, *overrides: str) -> list[str]:
    return [
        "train",
        "sl",
        "--alg",
        alg,
        "--config",
        f"examples/{alg}_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        "run.train_ranks=1",
        "train.batch_size=8",
        "train.micro_batch_size=8",
        "train.grad_accum=1",
        f"run.output_dir={out}",
        f"run.name={name}",
        *overrides,
    ]


@pytest.mark.parametrize("alg", ["sft", "dpo"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sl_zero3_on_one_gpu_trains_with_a_falling_loss(tmp_path, tiny_model_dir, oxrl, alg, lora):
    lr = "train.lr=1e-2" if lora else "train.lr=3e-3"
    result = oxrl(
        *sl(
            alg,
            tiny_model_dir,
            tmp_path,
            alg,
            "deepspeed.zero_stage=3",
            f"lora.enabled={str(lora).lower()}",
            "train.steps=20",
            lr,
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = history(tmp_path / alg)
    losses = [h["loss"] for h in steps]
    print(alg, "lora" if lora else "full", "loss", losses[0], "->", losses[-1])
    assert all(math.isfinite(x) for x in losses) and sum(losses[-5:]) < sum(losses[:5])
    assert all(h["trainer_peak_memory_gb"] > 0 for h in steps)  # logged on GPUs, as the RL loop logs it
    final = tmp_path / alg / "final"
    assert (final / ("adapter_model.safetensors" if lora else "model.safetensors")).is_file()


def test_sft_zero3_offloaded_to_cpu_memory_on_one_gpu_trains_with_a_falling_loss(tmp_path, tiny_model_dir, oxrl):
    """ZeRO-Offload on a GPU: bf16 weights gathered to the GPU, optimizer states and DeepSpeed's CPU Adam in CPU memory
    (what a 7B model on one GPU, or a colocated 32B, needs)."""
    result = oxrl(
        *sl(
            "sft",
            tiny_model_dir,
            tmp_path,
            "offload",
            "deepspeed.zero_stage=3",
            "deepspeed.offload_optimizer=true",
            "deepspeed.offload_param=true",
            "train.steps=20",
            "train.lr=3e-3",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [h["loss"] for h in history(tmp_path / "offload")]
    print("sft offloaded loss", losses[0], "->", losses[-1])
    assert all(math.isfinite(x) for x in losses) and sum(losses[-5:]) < sum(losses[:5])


@pytest.mark.parametrize(
    "alg, lora, extra",
    [
        ("cispo", False, ()),
        ("cispo", True, ()),
        ("sgrpo", False, ("train.sgrpo.kl_coeff=0.05",)),
        ("sgrpo", True, ()),
        ("ppo", False, ()),
        # float32 makes the tiny model 1.3 MiB: two buckets of at most 1 MiB, each shared and loaded on its own
        ("cispo", False, ("model.dtype=float32", "rollout.weight_bucket_mb=1")),
    ],
    ids=["cispo-full", "cispo-lora", "sgrpo-full-kl", "sgrpo-lora", "ppo-value-head", "cispo-full-two-buckets"],
)
def test_rl_colocated_on_one_gpu_refreshes_vllm_to_the_trainers_weights(
    tmp_path, tiny_model_dir, oxrl, alg, lora, extra
):
    """Three steps at a large learning rate: after each refresh (CUDA IPC, same GPU) vLLM's logprobs of its own
    samples must equal the trainer's within bf16 noise. LoRA runs failed at the first refresh before the merge was
    made without autograd history."""
    result = oxrl(
        *rl(
            alg,
            tiny_model_dir,
            tmp_path,
            alg,
            "run.train_ranks=1",
            f"lora.enabled={str(lora).lower()}",
            "train.micro_batch_size=16",
            *extra,
        ),
        env=TEST_REWARD,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = history(tmp_path / alg)
    gaps = [h["logprob_gap_abs"] for h in steps]
    print(alg, "lora" if lora else "full", "sampler-trainer logprob gap per step", gaps)
    assert [h["policy_version"] for h in steps] == [1, 2, 3]
    assert all(math.isfinite(h["loss"]) for h in steps)
    assert all(gap < BF16_LOGPROB_GAP for gap in gaps[1:])  # steps 2 and 3 sample from refreshed engines
    if alg == "ppo":
        assert all(math.isfinite(h["value_loss"]) for h in steps)
    assert (tmp_path / alg / "final" / ("adapter_model.safetensors" if lora else "model.safetensors")).is_file()


def test_multi_turn_episodes_on_one_gpu_train_the_policys_tokens_from_the_refreshed_engine(
    tmp_path, tiny_model_dir, oxrl
):
    """The guess-the-number example, three steps at a large learning rate, from the shipped SFT example's model (a
    random model's messages rarely end, and an episode ends with a cut message): episodes of several turns, and after
    each refresh (CUDA IPC) vLLM's logprobs of the policy's tokens, environment tokens in their context, equal the
    trainer's within bf16 noise."""
    sft = oxrl(
        "train",
        "sl",
        "--alg",
        "sft",
        "--config",
        "examples/sft_tiny.yaml",
        "train.steps=30",
        "run.train_ranks=1",
        "train.micro_batch_size=16",
        f"model.name_or_path={tiny_model_dir}",
        f"run.output_dir={tmp_path}",
    )
    assert sft.returncode == 0, sft.stderr[-3000:]
    result = oxrl(
        "train",
        "rl",
        "--config",
        "examples/cispo_game_tiny.yaml",
        "train.steps=3",
        "train.lr=1e-2",
        "run.train_ranks=1",
        "train.micro_batch_size=32",
        f"model.name_or_path={tmp_path / 'sft-tiny' / 'final'}",
        f"run.output_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = history(tmp_path / "cispo-game-tiny")
    gaps = [h["logprob_gap_abs"] for h in steps]
    print("multi-turn: turns per episode", [h["turns"] for h in steps], "logprob gap per step", gaps)
    assert [h["policy_version"] for h in steps] == [1, 2, 3] and all(h["turns"] > 1 for h in steps)
    assert all(gap < BF16_LOGPROB_GAP for gap in gaps[1:])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_a_tensor_parallel_engine_over_two_gpus_takes_each_refresh_from_the_rank_on_its_gpu(
    tmp_path, tiny_model_dir, oxrl
):
    """Issue 19's large-model layout on two GPUs: two ZeRO-3 trainer ranks and one vLLM engine of tensor parallelism
    2, a worker on each rank's GPU; every refresh hands each worker the CUDA IPC handles of the rank on its own GPU.
    Three steps at a large learning rate: steps 2 and 3 sample from both workers' refreshed shards. The workers'
    shared memory (vLLM's message queue) is gone after the run."""
    shared_memory = set(os.listdir("/dev/shm"))
    result = oxrl(
        *rl(
            "cispo",
            tiny_model_dir,
            tmp_path,
            "tp",
            "run.train_ranks=2",
            "rollout.tensor_parallel_size=2",
            "rollout.placement=colocated",
            "train.micro_batch_size=8",
        ),
        env=TEST_REWARD,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = history(tmp_path / "tp")
    gaps = [h["logprob_gap_abs"] for h in steps]
    print("tensor parallel 2: sampler-trainer logprob gap per step", gaps)
    assert [h["policy_version"] for h in steps] == [1, 2, 3] and all(gap < BF16_LOGPROB_GAP for gap in gaps[1:])
    placement = json.loads((tmp_path / "tp" / "placement.json").read_text())
    assert placement["mode"] == "colocated" and [len(workers) for workers in placement["engines"]] == [2]
    assert {w["gpus"][0] for w in placement["engines"][0]} == {r["gpus"][0] for r in placement["ranks"]}  # one each
    # vLLM's segments are gone. The CUDA driver's own per-process files (cuda.shm.<uid>.<pid>.<n>), which a process
    # that Ray kills leaves behind, are not vLLM's: two remained after this run on 2 H200s (tests/gpu/RESULTS.md).
    assert {name for name in os.listdir("/dev/shm") if not name.startswith("cuda.shm.")} <= shared_memory


@pytest.mark.parametrize(
    "ranks, tensor_parallel, extra",
    [(1, 1, ()), (2, 2, ("deepspeed.zero_stage=3",))],
    ids=["one-rank-one-engine", "zero3-two-ranks-tp2-engine"],
)
def test_split_engines_on_their_own_gpus_take_each_refresh_by_nccl_broadcast(
    tmp_path, tiny_model_dir, oxrl, ranks, tensor_parallel, extra
):
    """The split layout on GPUs: trainer ranks on some GPUs, a vLLM engine on others, and every refresh broadcast by
    NCCL from trainer rank 0 to each engine worker (ZeRO-3: the ranks gather each weight first; tensor parallelism 2:
    each worker takes the whole weights and keeps its shard). Three steps at a large learning rate: steps 2 and 3
    sample from refreshed engines."""
    gpus = ranks + tensor_parallel
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs")
    result = oxrl(
        *rl(
            "cispo",
            tiny_model_dir,
            tmp_path,
            "split",
            f"run.train_ranks={ranks}",
            "rollout.placement=split",
            "rollout.engines=1",
            f"rollout.tensor_parallel_size={tensor_parallel}",
            f"train.micro_batch_size={16 // ranks}",
            *extra,
        ),
        env=TEST_REWARD,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = history(tmp_path / "split")
    gaps = [h["logprob_gap_abs"] for h in steps]
    print(
        f"split, {ranks} rank(s) + an engine of tensor parallelism {tensor_parallel}: sampler-trainer logprob gap per "
        f"step {gaps}, refresh seconds {[h['time_refresh_s'] for h in steps]}"
    )
    assert [h["policy_version"] for h in steps] == [1, 2, 3] and all(gap < BF16_LOGPROB_GAP for gap in gaps[1:])
    placement = json.loads((tmp_path / "split" / "placement.json").read_text())
    assert placement["mode"] == "split" and "NCCL broadcast" in placement["placement"]
    rank_gpus = {g for r in placement["ranks"] for g in r["gpus"]}
    engine_gpus = {g for w in placement["engines"][0] for g in w["gpus"]}
    assert len(rank_gpus) == ranks and len(engine_gpus) == tensor_parallel and not rank_gpus & engine_gpus


@pytest.mark.own_ray_cluster  # every process of the run is its own: none may outlive it, the stopped one included
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_a_split_run_whose_engine_stops_before_the_nccl_weight_broadcast_ends_named_and_resumes(
    tmp_path, tiny_model_dir, oxrl, oxrl_signalled
):
    """The CPU suite's hang test (tests/integration/test_hangs.py) on GPUs: 1 rank + 1 engine, split; the engine is
    stopped in step 2's reward phase, after step 1's checkpoint, so the refresh's NCCL broadcast has a stopped peer
    (rank 0's side of it may finish: the tiny model's weights fit NCCL's buffers on the engine's GPU; on 2 H200s it
    did). The run ends within the broadcast's deadline, names the engine, kills it, and resumes."""
    run, pause = tmp_path / "hang", tmp_path / "pause"
    args = rl(
        "cispo",
        tiny_model_dir,
        tmp_path,
        "hang",
        "run.train_ranks=1",
        "rollout.placement=split",
        "rollout.engines=1",
        "train.micro_batch_size=16",
        "run.checkpoint_every=1",
        "run.hang_timeout_s=30",
        "reward.func=rl_test_rewards:digit_share_pausing_once",
    )
    engine_pid = lambda: json.loads((run / "placement.json").read_text())["engines"][0][0]["pid"]
    hung = oxrl_signalled(
        args,
        lambda stdout: pause.exists(),
        signal.SIGSTOP,
        after_signal=pause.unlink,
        pid_of=engine_pid,
        env=TEST_REWARD | {"PAUSE_FILE": str(pause), "PAUSE_AFTER": str(run / "ds" / "latest")},
    )
    message = hung.stderr.strip().splitlines()[-1]
    print("hang on GPUs:", round(hung.seconds_to_exit, 1), "s after the stop:", message)
    assert hung.returncode == 1 and message.startswith("hang: weight broadcast "), hung.stderr[-3000:]
    assert f"engine0 (pid {engine_pid()} on " in message and ", stopped)" in message
    assert hung.seconds_to_exit < 4 * 30 + 60 and message.endswith(" --resume")
    assert "=== engine0 (pid" in (run / "stacks.txt").read_text() and (run / "ds" / "latest").read_text() == "step-1"
    assert hung.leftover_processes == [], hung.leftover_processes
    resumed = oxrl(*args, "--resume", env=TEST_REWARD)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [h["step"] for h in history(run)] == [2, 3]


@pytest.mark.own_ray_cluster  # every process of the run is its own: none may outlive it
def test_sigterm_to_every_process_of_a_colocated_run_saves_the_step_it_reached_and_resumes(
    tmp_path, tiny_model_dir, oxrl, oxrl_signalled
):
    """The CPU suite's job-wide SIGTERM (tests/integration/test_rl.py) on a GPU, as Slurm preempts a job: the rank,
    the vLLM engine on its GPU and Ray's daemons get SIGTERM with the driver, mid-step 1, and wait for the driver,
    which finishes the step, saves it and shuts them down; the run resumes."""
    run, pause = tmp_path / "job", tmp_path / "pause"
    args = rl(
        "cispo",
        tiny_model_dir,
        tmp_path,
        "job",
        "run.train_ranks=1",
        "train.micro_batch_size=16",
        "reward.func=rl_test_rewards:digit_share_pausing_once",
    )
    stopped = oxrl_signalled(
        args,
        lambda stdout: pause.exists(),
        signal.SIGTERM,
        "job",
        after_signal=pause.unlink,
        env=TEST_REWARD | {"PAUSE_FILE": str(pause)},
    )
    print("job-wide SIGTERM on a GPU:", round(stopped.seconds_to_exit, 1), "s to exit")
    assert stopped.returncode == 143 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert stopped.stderr.strip().splitlines()[-1].startswith("stopped by SIGTERM after step 1; to continue: ")
    assert (run / "ds" / "latest").read_text() == "step-1" and not list(run.glob(".partial-*"))
    # the CUDA driver's own per-process files (cuda.shm.<uid>.<pid>.<n>) stay, as after any CUDA process
    assert stopped.leftover_processes == [], stopped.leftover_processes
    assert [name for name in stopped.leftover_shm if not name.startswith("cuda.shm.")] == []
    resumed = oxrl(*args, "--resume", env=TEST_REWARD)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [h["step"] for h in history(run)] == [2, 3]


def test_online_dpo_samples_with_vllm_in_the_sl_loop_on_one_gpu(tmp_path, tiny_model_dir, oxrl):
    result = oxrl(
        *sl(
            "online-dpo",
            tiny_model_dir,
            tmp_path,
            "odpo",
            "train.steps=3",
            "data.val=null",
            "reward.func=rl_test_rewards:digit_share",
        ),
        env=TEST_REWARD,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(math.isfinite(h["loss"]) for h in history(tmp_path / "odpo"))


def test_a_lora_run_merges_and_eval_serves_the_merged_model_on_the_gpu(tmp_path, tiny_model_dir, oxrl):
    train = oxrl(
        *sl(
            "sft",
            tiny_model_dir,
            tmp_path,
            "lora",
            "lora.enabled=true",
            "train.steps=10",
            "train.lr=1e-2",
            "data.val=null",
        )
    )
    assert train.returncode == 0, train.stderr[-3000:]
    merged = tmp_path / "merged"
    merge = oxrl("merge-lora", tmp_path / "lora" / "final", "--out", merged)
    assert merge.returncode == 0, merge.stderr[-3000:]
    prompts = write_jsonl(arithmetic_problems(16, seed=3, max_operand=9), tmp_path / "prompts.jsonl")
    evaluated = oxrl(
        "eval",
        "--model",
        merged,
        "--data",
        prompts,
        "--reward",
        "math",
        "--n",
        "4",
        "--max-tokens",
        "16",
        "--out",
        tmp_path / "eval",
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["samples"] == 64 and 0 <= summary["metrics"]["pass@1"] <= 1


def test_sft_resumed_after_a_stop_ends_with_the_uninterrupted_runs_weights(tmp_path, tiny_model_dir, oxrl):
    common = ("train.lr_scheduler=constant", "train.warmup_steps=4", "data.val=null", "run.checkpoint_every=0")
    whole = oxrl(*sl("sft", tiny_model_dir, tmp_path / "a", "run", *common, "train.steps=8"))
    first = oxrl(*sl("sft", tiny_model_dir, tmp_path / "b", "run", *common, "train.steps=4"))
    assert whole.returncode == 0 and first.returncode == 0, (whole.stderr + first.stderr)[-3000:]
    resumed = oxrl(*sl("sft", tiny_model_dir, tmp_path / "b", "run", *common, "train.steps=8"), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_file(tmp_path / "a" / "run" / "final" / "model.safetensors")
    b = load_file(tmp_path / "b" / "run" / "final" / "model.safetensors")
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    print("resumed vs uninterrupted: max |weight difference|", worst)
    assert worst <= 1e-2  # bf16 weights; the CPU suite holds float32 runs to exact equality


def test_rlaif_with_the_judge_colocated_on_the_trainers_gpu(tmp_path, tiny_model_dir, oxrl):
    """Trainer rank, rollout engine and the judge's engine on one GPU (a third of it each to Ray; vLLM's memory by
    its share): two CISPO steps judged, every judgment logged, the judge's time reported."""
    result = oxrl(
        "train",
        "rl",
        "--config",
        "examples/rlaif_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        f"reward.judge.model={tiny_model_dir}",
        "reward.judge.placement=colocated",
        "run.train_ranks=1",
        "train.batch_size=32",
        "train.micro_batch_size=16",
        "train.grad_accum=2",
        "train.steps=2",
        f"run.output_dir={tmp_path}",
        "run.name=rlaif",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "rlaif"
    assert json.loads((run / "placement.json").read_text())["placement"].endswith("the judge on trainer rank 0's GPU")
    assert len((run / "judgments.jsonl").read_text().splitlines()) == 2 * 32
    assert all(h["time_judge_s"] > 0 for h in history(run))


def vlm(alg: str, out: Path, *overrides: str) -> list[str]:
    """A shipped VLM example (oxrl-tiny-vl, the squares pictures) on one trainer rank."""
    return [
        "train",
        "rl" if alg == "cispo" else "sl",
        "--alg",
        alg,
        "--config",
        f"examples/vlm_{alg}_tiny.yaml",
        "run.train_ranks=1",
        f"run.output_dir={out}",
        f"run.name={alg}",
        *overrides,
    ]


def test_vlm_sft_zero3_on_one_gpu_trains_on_images_with_a_falling_loss(tmp_path, tiny_vl_model_dir, oxrl):
    result = oxrl(
        *vlm(
            "sft",
            tmp_path,
            "train.batch_size=8",
            "train.micro_batch_size=8",
            "train.grad_accum=1",
            "train.steps=20",
            "train.lr=3e-3",
            "data.val=null",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [h["loss"] for h in history(tmp_path / "sft")]
    print("vlm sft loss", losses[0], "->", losses[-1])
    assert all(math.isfinite(x) for x in losses) and sum(losses[-5:]) < sum(losses[:5])
    assert (tmp_path / "sft" / "final" / "model.safetensors").is_file()


def test_vlm_dpo_zero3_on_one_gpu_widens_the_held_out_margin(tmp_path, tiny_vl_model_dir, oxrl):
    """Chosen and rejected differ in the count alone, which only the picture tells: the held-out reward margin grows."""
    result = oxrl(
        *vlm(
            "dpo",
            tmp_path,
            "train.batch_size=8",
            "train.micro_batch_size=8",
            "train.grad_accum=1",
            "train.steps=20",
            "train.lr=3e-3",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "dpo" / "summary.json").read_text())
    before, after = summary["eval_before"]["eval_rewards/margins"], summary["eval_after"]["eval_rewards/margins"]
    print("vlm dpo held-out margin", before, "->", after, "accuracy", summary["eval_after"]["eval_rewards/accuracies"])
    assert math.isfinite(after) and after > before


@pytest.mark.parametrize("freeze_vision", [True, False], ids=["frozen-vision", "trained-vision"])
def test_vlm_cispo_colocated_on_one_gpu_refreshes_vllm_to_the_trainers_weights(
    tmp_path, tiny_vl_model_dir, oxrl, freeze_vision
):
    """Images through vLLM (multi_modal_data) and the trainer (pixel values, M-RoPE) in bf16; three steps at a large
    learning rate: after each refresh (CUDA IPC; the vision tower too when it trains) vLLM's logprobs of its own
    samples equal the trainer's within bf16 noise."""
    result = oxrl(
        *vlm(
            "cispo",
            tmp_path,
            "data.val=null",
            "train.steps=3",
            "train.lr=1e-2",
            "train.batch_size=32",
            "train.micro_batch_size=16",
            "train.grad_accum=2",
            "reward.func=rl_test_rewards:digit_share",
            f"model.freeze_vision={str(freeze_vision).lower()}",
        ),
        env=TEST_REWARD,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = history(tmp_path / "cispo")
    gaps = [h["logprob_gap_abs"] for h in steps]
    print("vlm cispo", "frozen" if freeze_vision else "trained", "vision: sampler-trainer logprob gap per step", gaps)
    assert [h["policy_version"] for h in steps] == [1, 2, 3] and all(gap < BF16_LOGPROB_GAP for gap in gaps[1:])


@pytest.mark.parametrize("family", ["qwen3_vl", "smolvlm", "audio"])
def test_each_multimodal_family_trains_on_one_gpu_and_its_refreshed_vllm_samples_as_the_trainer_scores(
    tmp_path, request, oxrl, family
):
    """Qwen3-VL, SmolVLM (Idefics3) and Qwen2-Audio's tiny models in bf16, colocated: SFT on their counting task
    trains with a finite loss, and three CISPO steps at a large learning rate leave vLLM's logprobs of its own samples
    within bf16 noise of the trainer's after each refresh (CUDA IPC)."""
    model = request.getfixturevalue(f"tiny_{family}_model_dir")
    examples = "audio" if family == "audio" else "vlm"
    common = ["run.train_ranks=1", f"run.output_dir={tmp_path}", f"model.name_or_path={model}", "data.val=null"]
    sft = oxrl(
        "train",
        "sl",
        "--alg",
        "sft",
        "--config",
        f"examples/{examples}_sft_tiny.yaml",
        *common,
        "run.name=sft",
        "train.batch_size=8",
        "train.micro_batch_size=8",
        "train.grad_accum=1",
        "train.steps=5",
    )
    assert sft.returncode == 0, sft.stderr[-3000:]
    assert all(math.isfinite(h["loss"]) for h in history(tmp_path / "sft"))
    result = oxrl(
        "train",
        "rl",
        "--alg",
        "cispo",
        "--config",
        f"examples/{examples}_cispo_tiny.yaml",
        *common,
        "run.name=cispo",
        "train.steps=3",
        "train.lr=1e-2",
        "train.batch_size=32",
        "train.micro_batch_size=16",
        "train.grad_accum=2",
        "reward.func=rl_test_rewards:digit_share",
        env=TEST_REWARD,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = history(tmp_path / "cispo")
    gaps = [h["logprob_gap_abs"] for h in steps]
    print(family, "cispo: sampler-trainer logprob gap per step", gaps)
    assert [h["policy_version"] for h in steps] == [1, 2, 3] and all(gap < BF16_LOGPROB_GAP for gap in gaps[1:])


@pytest.mark.parametrize("example", ["qwen3_moe", "qwen3_5_moe"])
def test_each_mixture_of_experts_replays_the_engines_routes_on_one_gpu_and_samples_as_the_trainer_scores(
    tmp_path, oxrl, example
):
    """The tiny Qwen3-MoE and Qwen3.5-MoE in bf16, colocated, GRPO with full weights: the engines record each token's
    experts (rollout/routes.py), the trainer replays them, and after each refresh vLLM's logprobs stay within bf16
    noise of the trainer's; the trainer's own routers agree with the engine's on most token-layers."""
    result = oxrl(
        "train",
        "rl",
        "--config",
        f"examples/families/{example}.yaml",
        "run.train_ranks=1",
        f"run.output_dir={tmp_path}",
        "data.val=null",
        "train.steps=3",
        "train.lr=1e-3",
        "reward.func=rl_test_rewards:digit_share",
        env=TEST_REWARD,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (summary,) = tmp_path.glob("*/summary.json")
    steps = json.loads(summary.read_text())["history"]
    print(
        example,
        "gap per step",
        [h["logprob_gap_abs"] for h in steps],
        "agreement",
        [h["routing_agreement"] for h in steps],
    )
    assert [h["policy_version"] for h in steps] == [1, 2, 3]
    assert all(h["logprob_gap_abs"] < BF16_LOGPROB_GAP and h["routing_agreement"] >= 0.9 for h in steps)
