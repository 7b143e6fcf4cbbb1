"""SFT end to end on the real stack: the `oxrl` console script, Ray, DeepSpeed (gloo), the tiny model."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fingerprint import remember
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from oxrl_core.preprocess.arithmetic import arithmetic_problems, sft_records, write_jsonl

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def arithmetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("arith")
    return {
        "train": write_jsonl(sft_records(arithmetic_problems(64, seed=0)), folder / "train.jsonl"),
        "val": write_jsonl(sft_records(arithmetic_problems(16, seed=1)), folder / "val.jsonl"),
    }


def sft_args(tiny_model_dir, arithmetic, out, name, *overrides):
    return [
        "train",
        "sl",
        "--alg",
        "sft",
        f"model.name_or_path={tiny_model_dir}",
        f"data.train=[{{path: {arithmetic['train']}}}]",
        f"data.val={arithmetic['val']}",
        f"run.output_dir={out}",
        f"run.name={name}",
        "train.lr=3e-3",
        "train.batch_size=8",
        "train.micro_batch_size=2",
        "train.grad_accum=2",
        "run.train_ranks=2",
        *overrides,
    ]


def hf_eval_loss(model, tokenizer_dir, val_file) -> float:
    """Token-mean NLL of the responses, computed independently with transformers' own `labels` loss."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    nll = tokens = 0.0
    for line in val_file.read_text().splitlines():
        record = json.loads(line)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": record["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        full = tokenizer.apply_chat_template(
            [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["completion"]}],
            tokenize=False,
        )
        ids = tokenizer(full, add_special_tokens=False, return_tensors="pt")["input_ids"]
        n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        labels = ids.clone()
        labels[:, :n_prompt] = -100
        with torch.no_grad():
            loss = model(input_ids=ids, labels=labels).loss.double().item()
        n = (labels[:, 1:] != -100).sum().item()
        nll += loss * n
        tokens += n
    return nll / tokens


@pytest.mark.quick
def test_the_shipped_example_on_two_zero3_ranks_loss_falls_checkpoint_reloads_and_mlflow_has_the_run(shipped_sft_run):
    run = shipped_sft_run
    summary = json.loads((run / "summary.json").read_text())
    remember("sft", summary)
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-000020", "checkpoint-000040"]
    assert (run / "ds" / "latest").read_text() == "step-60"
    assert (run / "checkpoint-000020" / "model.safetensors").is_file()
    client = MlflowClient(f"sqlite:///{run.parent / 'mlflow.db'}")
    losses = [m.value for m in client.get_metric_history(summary["mlflow_run_id"], "loss")]
    assert len(losses) == 60
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses

    # MLflow: params and per-step metrics read back
    mlflow_run = client.get_run(summary["mlflow_run_id"])
    assert mlflow_run.data.params["deepspeed.zero_stage"] == "3" and mlflow_run.data.params["train.lr"] == "0.003"
    assert [m.step for m in client.get_metric_history(mlflow_run.info.run_id, "lr")] == list(range(1, 61))
    assert mlflow_run.info.status == "FINISHED"

    # The final folder reloads in transformers and gives the trainer's eval loss.
    final = run / "final"
    model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    assert (
        abs(hf_eval_loss(model, final, REPO / "examples/data/arithmetic_sft_val.jsonl") - summary["eval_loss"]) <= 1e-4
    )


@pytest.mark.slow  # vLLM loads saved checkpoints in test_eval.py
def test_vllm_loads_the_saved_checkpoint_and_generates(tmp_path, shipped_sft_run):
    script = textwrap.dedent(f"""
        from vllm import LLM, SamplingParams
        if __name__ == "__main__":
            llm = LLM(model="{shipped_sft_run / "final"}", dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
                      kv_cache_memory_bytes=2**26)  # not a share of the NUMA node, which VMs report small at start
            out = llm.generate(["What is 3 + 4?"], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
            print("GENERATED", len(out[0].outputs[0].token_ids))
    """)
    (tmp_path / "gen.py").write_text(script)
    # The engine in the script's own process, as oxrl's RolloutEngine runs it: on CPU a separate engine process takes
    # about 25 s longer to start.
    gen = subprocess.run(
        [sys.executable, str(tmp_path / "gen.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    assert "GENERATED 8" in gen.stdout, gen.stderr[-3000:]


@pytest.mark.own_ray_cluster  # the signalled run's whole process tree is its own: nothing of it may outlive it
@pytest.mark.slow  # SFT runs RL's harness: RL's job-wide SIGTERM + resume and KTO's resume run in the whole suite
def test_sigterm_to_every_process_of_the_job_saves_the_step_reached_and_resume_ends_with_the_uninterrupted_weights(
    tmp_path, tiny_model_dir, arithmetic, oxrl, oxrl_signalled
):
    """Slurm's preemption: SIGTERM to every process of the job at once, some steps after a periodic checkpoint."""
    out, elsewhere = tmp_path / "runs", tmp_path / "other"
    # 20 steps of 8 cover the 64 examples 2.5 times and the warm-up may span the stop: the LR schedule and the data
    # order (epochs) must both be restored to match
    common = (
        "deepspeed.zero_stage=2",
        "train.lr_scheduler=constant",
        "train.warmup_steps=8",
        "data.val=null",
        "train.steps=20",
        "run.checkpoint_every=4",
    )
    whole = oxrl(*sft_args(tiny_model_dir, arithmetic, elsewhere, "whole", *common))
    assert whole.returncode == 0, whole.stderr[-3000:]
    latest = out / "split" / "ds" / "latest"
    stopped = oxrl_signalled(
        sft_args(tiny_model_dir, arithmetic, out, "split", *common), lambda _: latest.is_file(), signal.SIGTERM, "job"
    )
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "Error" not in stopped.stderr, stopped.stderr[-3000:]
    last_line = stopped.stderr.strip().splitlines()[-1]
    match = re.fullmatch(r"stopped by SIGTERM after step (\d+); to continue: oxrl train sl .* --resume", last_line)
    assert match, last_line
    step = int(match[1])  # the step in progress when the signal came, after step 4's checkpoint
    assert 4 < step < 20 and latest.read_text() == f"step-{step}"
    saved = sorted({*range(4, step, 4), step})
    assert sorted(p.name for p in latest.parent.iterdir() if p.is_dir()) == sorted(f"step-{s}" for s in saved)
    assert sorted(p.name for p in (out / "split").glob("*checkpoint-*")) == [f"checkpoint-{s:06d}" for s in saved]
    assert stopped.leftover_processes == [] and stopped.leftover_shm == []

    again = oxrl(*sft_args(tiny_model_dir, arithmetic, out, "split", *common))
    assert again.returncode == 2 and "--resume" in again.stderr  # an existing run is never overwritten
    resumed = oxrl(*sft_args(tiny_model_dir, arithmetic, out, "split", *common), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from the checkpoint of step {step} " in resumed.stdout
    assert json.loads((out / "split" / "summary.json").read_text())["first_step"] == step + 1
    a = load_file(elsewhere / "whole" / "final" / "model.safetensors")
    b = load_file(out / "split" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model_dir, arithmetic, oxrl) -> tuple[Path, Path]:
    """A ZeRO-3 LoRA run and its 5-record validation file: 5 records in micro-batches of 2 on 2 ranks make an odd
    number of batches, which ZeRO-3 (every rank joins every forward) can only evaluate if the loop evens them out."""
    out = tmp_path_factory.mktemp("lora")
    val = out / "val5.jsonl"
    val.write_text("\n".join(arithmetic["val"].read_text().splitlines()[:5]) + "\n")
    result = oxrl(
        *sft_args(
            tiny_model_dir,
            arithmetic,
            out,
            "lora",
            "deepspeed.zero_stage=3",
            "train.steps=5",
            "lora.enabled=true",
            "lora.r=8",
            "lora.target_modules=[q_proj, v_proj, up_proj]",
            f"data.val={val}",
            "train.lr=1e-2",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out / "lora", val


@pytest.mark.slow  # LoRA under ZeRO-3 trains in test_rl.py's ppo-lora and split-lora-merged runs
def test_lora_zero3_adapter_is_non_empty_and_reproduces_the_trainer_eval_loss(tiny_model_dir, lora_run):
    from peft import PeftModel

    run, val = lora_run
    final = run / "final"
    adapter = load_file(final / "adapter_model.safetensors")
    assert adapter and all(t.numel() > 0 for t in adapter.values())
    assert any("up_proj.lora_B" in k for k in adapter)
    assert any(t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k)  # B starts at zero: it trained

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, final)
    summary = json.loads((run / "summary.json").read_text())
    assert abs(hf_eval_loss(model, final, val) - summary["eval_loss"]) <= 1e-4


NEW_TOKENS = 8  # the greedy continuations compared after merge-lora


def greedy(model, prompt: list[int]) -> list[int]:
    """transformers' greedy continuation, EOS ignored (as vLLM is told to)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def token_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """log p(tokens[i] | prompt, tokens[:i]) from one forward: logits[:, t] predicts token t + 1."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[
            0, len(prompt) - 1 : -1
        ]  # [len(tokens), vocab]
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, torch.tensor(tokens)[:, None]).flatten().tolist()


@pytest.mark.slow  # merged LoRA weights reach vLLM in test_rl.py's split-lora-merged run
def test_adapter_of_a_zero3_lora_run_merges_and_vllm_generates_what_transformers_does(
    tmp_path, tiny_model_dir, lora_run, oxrl
):
    final, merged = lora_run[0] / "final", tmp_path / "merged"
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()

    merge = oxrl("merge-lora", final, "--out", merged)  # the base comes from the adapter's record of it
    assert merge.returncode == 0, merge.stderr[-3000:]
    names = load_file(merged / "model.safetensors").keys()
    assert names == load_file(tiny_model_dir / "model.safetensors").keys()  # no peft prefixes or .base_layer left

    tokenizer = AutoTokenizer.from_pretrained(merged)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True)[
        "input_ids"
    ]
    merged_model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    expected_ids = greedy(merged_model, prompt)
    script = textwrap.dedent(f"""
        import json
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        if __name__ == "__main__":
            llm = LLM(model="{merged}", dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
                      kv_cache_memory_bytes=2**26)  # not a share of the NUMA node, which VMs report small at start
            params = SamplingParams(max_tokens={NEW_TOKENS}, temperature=0.0, ignore_eos=True, logprobs=0)
            out = llm.generate([TokensPrompt(prompt_token_ids={prompt})], params)[0].outputs[0]
            print("GENERATED", json.dumps([out.token_ids, [step[t].logprob for t, step in zip(out.token_ids, out.logprobs)]]))
    """)
    (tmp_path / "gen.py").write_text(script)
    # The engine in the script's own process, as oxrl's RolloutEngine runs it: on CPU a separate engine process takes
    # about 25 s longer to start.
    gen = subprocess.run(
        [sys.executable, str(tmp_path / "gen.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    lines = [line for line in gen.stdout.splitlines() if line.startswith("GENERATED ")]
    assert lines, gen.stderr[-3000:]
    vllm_ids, vllm_logprobs = json.loads(lines[0].removeprefix("GENERATED "))
    # float32 on both sides: greedy could differ only where the top two tokens are within rounding of each other
    assert vllm_ids == expected_ids
    merged_logprobs = token_logprobs(merged_model, prompt, vllm_ids)
    assert max(abs(a - b) for a, b in zip(vllm_logprobs, merged_logprobs)) <= 1e-3
    # and vLLM served the merged weights, not the base: the base gives those tokens other logprobs
    base_logprobs = token_logprobs(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), prompt, vllm_ids
    )
    assert max(abs(a - b) for a, b in zip(vllm_logprobs, base_logprobs)) > 1e-2


def test_zero3_with_optimizer_and_parameters_offloaded_trains_the_same_weights(
    tmp_path, tiny_model_dir, arithmetic, oxrl_side_by_side
):
    """ZeRO-Offload (optimizer states and update in CPU memory through DeepSpeed's CPU Adam, the parameters too): the
    same 3 steps give the weights of the run without it. It crashed at the engine's start before (DeepSpeed refuses
    torch's AdamW under offload). One rank each: offloading is each rank's own (two side by side cost 2 minutes)."""
    runs = {"in-place": [], "offloaded": ["deepspeed.offload_optimizer=true", "deepspeed.offload_param=true"]}
    # each run in its own output folder: two runs creating one MLflow store at once collide
    results = oxrl_side_by_side(
        *(
            sft_args(
                tiny_model_dir,
                arithmetic,
                tmp_path / name,
                name,
                "deepspeed.zero_stage=3",
                "train.steps=3",
                "data.val=null",
                "run.train_ranks=1",
                "train.grad_accum=4",
                *offload,
            )
            for name, offload in runs.items()
        )
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    initial = load_file(Path(tiny_model_dir) / "model.safetensors")
    in_place, offloaded = (load_file(tmp_path / name / name / "final" / "model.safetensors") for name in runs)
    assert max((offloaded[k] - in_place[k]).abs().max().item() for k in in_place) < 1e-5
    assert max((in_place[k] - initial[k]).abs().max().item() for k in in_place) > 1e-3  # the steps moved the weights


@pytest.mark.slow  # records' errors are unit-tested (tests/unit/test_sft_data.py)
def test_bad_records_are_reported_by_file_and_line_and_skipped(tmp_path, tiny_model_dir, arithmetic, oxrl, monkeypatch):
    data = tmp_path / "mixed.jsonl"
    good = arithmetic["train"].read_text().splitlines()[:8]
    data.write_text(
        "\n".join(
            [
                good[0],
                "{not json",
                good[1],
                '{"prompt": "hi"}',
                good[2],
                '{"prompt": "hi", "completion": ""}',
                *good[3:],
            ]
        )
        + "\n"
    )
    tracking = tmp_path / "elsewhere.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tracking}")
    result = oxrl(
        "train",
        "sl",
        f"model.name_or_path={tiny_model_dir}",
        f"data.train=[{{path: {data}}}]",
        f"run.output_dir={tmp_path / 'runs'}",
        "run.name=bad",
        "train.steps=1",
        "train.batch_size=2",
        "train.micro_batch_size=2",
        "deepspeed.zero_stage=0",
        "run.save_final=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "8 of 11 records used, 3 skipped" in result.stdout
    assert f"{data}:2: " in result.stdout and f"{data}:4: " in result.stdout and f"{data}:6: " in result.stdout
    assert "completion" in (tmp_path / "runs" / "bad" / "skipped_records.txt").read_text()
    # MLFLOW_TRACKING_URI is honoured: the run is in that store, not beside the run folders
    summary = json.loads((tmp_path / "runs" / "bad" / "summary.json").read_text())
    assert MlflowClient(f"sqlite:///{tracking}").get_run(summary["mlflow_run_id"]).info.status == "FINISHED"
    assert not (tmp_path / "runs" / "mlflow.db").exists()
    assert not (tmp_path / "runs" / "bad" / "final").exists() and not (tmp_path / "runs" / "bad" / "ds").exists()

    strict = oxrl(
        "train",
        "sl",
        "--strict",
        f"model.name_or_path={tiny_model_dir}",
        f"data.train=[{{path: {data}}}]",
        f"run.output_dir={tmp_path / 'runs'}",
        "run.name=strict",
        "train.batch_size=2",
        "train.micro_batch_size=2",
    )
    assert strict.returncode == 2
    assert f"{data}:2:" in strict.stderr and "Traceback" not in strict.stderr


@pytest.mark.own_ray_cluster  # the whole process tree is the run's: nothing of it may outlive it
@pytest.mark.parametrize(
    "signum, to, starting",
    [(signal.SIGTERM, "driver", "ray"), pytest.param(signal.SIGINT, "group", "ranks", marks=pytest.mark.slow)],
    ids=["sigterm-starting-ray", "ctrl-c-starting-ranks"],
)
def test_a_signal_during_start_up_stops_the_run_at_once_leaving_nothing(
    tmp_path, tiny_model_dir, arithmetic, oxrl_signalled, signum, to, starting
):
    def when(stdout: str) -> bool:  # the data are read before Ray starts; a rank's log opens as the rank starts
        return "records used" in stdout if starting == "ray" else (tmp_path / "run" / "logs" / "rank0.log").exists()

    stopped = oxrl_signalled(sft_args(tiny_model_dir, arithmetic, tmp_path, "run", "train.steps=50"), when, signum, to)
    assert stopped.returncode == 128 + signum, stopped.stderr[-3000:]
    assert stopped.seconds_to_exit < 60
    last_line = stopped.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"stopped by {signum.name} during start-up; nothing to resume; to start: oxrl train sl")
    assert not (tmp_path / "run" / "ds" / "latest").exists() and not (tmp_path / "run" / "crash.txt").exists()
    assert stopped.leftover_processes == [] and stopped.leftover_shm == []


@pytest.mark.own_ray_cluster  # the ranks must run in the mount namespace that holds the small disk
@pytest.mark.slow  # a checkpoint's failure and resume at another setting
def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_previous_checkpoint_resumes(
    tmp_path, tiny_model_dir, arithmetic, oxrl
):
    """The run folder lies on an 8 MB tmpfs: step 1's checkpoint (about 5.5 MB) fits, step 2's does not."""
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    args = sft_args(
        tiny_model_dir,
        arithmetic,
        disk,
        "run",
        "train.steps=3",
        "run.checkpoint_every=1",
        "data.val=null",
        f"run.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
    )
    oxrl_script = Path(sys.executable).parent / "oxrl"
    script = (
        f"mount -t tmpfs -o size=8m tmpfs {disk} && {oxrl_script} {shlex.join(args)}; code=$?; "
        f"cp -r {disk}/run {kept}; exit $code"
    )
    full = subprocess.run(
        ["unshare", "--map-root-user", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=600
    )
    assert full.returncode == 2, full.stderr[-3000:]
    error = full.stderr.strip().splitlines()[-1]
    assert (
        error.startswith("error: checkpoint of step 2: no space left on the disk of ")
        and "the last complete checkpoint (step-1) is intact" in error
    ), error
    assert (kept / "ds" / "latest").read_text() == "step-1" and not (kept / "ds" / "step-2").exists()
    # the checkpoint left is complete: the run resumes from it (in a folder with room) and finishes
    resumed = oxrl(
        *sft_args(
            tiny_model_dir,
            arithmetic,
            tmp_path,
            "kept",
            "train.steps=3",
            "data.val=null",
            f"run.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        ),
        "--resume",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((kept / "summary.json").read_text())["first_step"] == 2
