"""oxrl's RL step against verl's GRPO trainer on the same work, same GPUs, same run: a benchmark.

The work is `rl_step.py`'s (see vs_trl.py): a random-weight model of Qwen2.5-0.5B's shape with oxrl-tiny's tokenizer,
per GPU 64 prompts of exactly 128 tokens x 8 samples x up to 512 new tokens, temperature 1, CISPO, one optimizer step
over the step's samples in micro-batches of 32, AdamW at lr 1e-6 (constant), bf16, vLLM at 40% of each GPU,
colocated. verl runs `python3 -m verl.trainer.main_ppo` with GRPO's advantages, its own CISPO loss, an FSDP actor and
a vLLM rollout on the same GPUs, no KL and no critic; its data is a parquet file written from the very records oxrl
loads, and its reward is oxrl's reward function, called through a `custom_reward_function` module written here. Every
verl setting comes from the same oxrl config (`verl_overrides`), so an override given here changes both sides. At
`rollout.lag=1` with `rollout.placement=split`, verl runs its one-step-off-policy trainer instead (`verl_entry`), its
GPUs split as oxrl's; `--long-tail` gives both sides rl_step.py's long-tailed response lengths.

Steps, one after the other, each side on empty GPUs: (1) prepare: the model, prompts, `rl_step.yaml` (rl_step.prepare)
and verl's inputs; (2) verl for `--steps` steps; (3) oxrl's `train` (`oxrl_core.loops.train`) on `rl_step.yaml`.
Reported per side: the median over the steps after the first of each phase (verl's `timing_s/gen`, `reward`,
`old_log_prob`, `update_actor`, `update_weights`, `step`), generated and trained tokens/s, peak GPU memory, and the
ratio.

    python benchmarks/vs_verl.py --out DIR [--gpus N] [--steps 4] [--verl-site DIR] [--side both|verl|oxrl] [--long-tail]
        [KEY=VALUE ...]
    python benchmarks/vs_verl.py --smoke --out DIR   # CPU, no verl needed: verl's inputs written from the tiny model

`--verl-site`: a folder holding verl and the packages it needs beside the host's torch and vLLM (`pip install
--target`), put first on verl's PYTHONPATH only, so that oxrl's stack stays untouched.
"""

import argparse
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from vs_trl import (
    PHASES,
    _device,
    _end_group,
    _load,
    _run_child,
    _wait_for_free_gpu,
    _write,
    child_oxrl,
    child_prepare,
    parse_args,
    run_child,
    summarize,
)

REWARD_MODULE = '''"""verl's custom_reward_function for a benchmark against oxrl (written by benchmarks/vs_verl.py): oxrl's reward
{spec!r}, given the oxrl record each parquet row came from."""
import json

from oxrl_core.rewards import resolve_reward

REWARD = resolve_reward({spec!r}, {kwargs!r})


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(REWARD(solution_str, json.loads(extra_info["oxrl_record"])))
'''


def verl_rows(config, tokenizer) -> list[dict]:
    """verl's dataset rows (RLHFDataset's columns) for the prompts oxrl trains on, read by oxrl's own loader."""
    from oxrl_core.data.records import load_prompts, prompt_messages

    rows = []
    for source in config.data.train:
        examples, _ = load_prompts(source.path, tokenizer, config.rollout.max_prompt_len, strict=True)
        for example in examples:
            rows.append(
                {
                    "data_source": "oxrl",
                    "prompt": prompt_messages(example.record),
                    "ability": "oxrl",
                    "reward_model": {"style": "rule", "ground_truth": str(example.record.get("answer", ""))},
                    "extra_info": {"index": len(rows), "oxrl_record": json.dumps(example.record)},
                }
            )
    return rows


def write_verl_inputs(config, tokenizer, out: Path) -> dict:
    """verl's train parquet and reward module under `out`; their paths."""
    import pandas as pd

    if config.reward.func in ("env", "judge", "reward_model"):
        raise SystemExit(f"vs_verl: reward.func={config.reward.func} has no verl counterpart mapped here")
    paths = {"train": out / "verl_train.parquet", "reward": out / "verl_reward.py"}
    pd.DataFrame(verl_rows(config, tokenizer)).to_parquet(paths["train"])
    paths["reward"].write_text(REWARD_MODULE.format(spec=config.reward.func, kwargs=dict(config.reward.kwargs)))
    return paths


def verl_entry(config) -> str:
    """verl's trainer for the run `config` describes: its synchronous one (colocated), or at `rollout.lag: 1` with
    split placement its one-step-off-policy trainer, which generates step t + 1's batch while step t trains."""
    if config.rollout.lag == 1 and config.rollout.placement == "split":
        return "verl.experimental.one_step_off_policy.main_ppo"
    return "verl.trainer.main_ppo"


def verl_overrides(config, paths: dict, gpus: int, steps: int, on_gpu: bool) -> list[str]:
    """`verl_entry(config)`'s overrides for the run `config` describes: full weights, CISPO, no KL; colocated and
    strictly on-policy, or split at a lag of 1."""
    train, rollout, cispo = config.train, config.rollout, config.train.settings
    one_step_off = verl_entry(config) != "verl.trainer.main_ppo"
    unsupported = {
        "train.alg (only cispo is mapped)": train.alg != "cispo",
        "lora.enabled": config.lora.enabled,
        "rollout.placement=split (mapped at rollout.lag=1 only)": rollout.placement == "split" and not one_step_off,
        "rollout.lag (mapped at 1 with rollout.placement=split only)": rollout.lag > 0 and not one_step_off,
        "rollout.max_staleness (verl's fully asynchronous trainer is not mapped)": rollout.max_staleness > 0,
        "rollout.tensor_parallel_size": rollout.tensor_parallel_size != 1,
    }
    if any(unsupported.values()):
        raise SystemExit("vs_verl: no verl counterpart mapped for " + ", ".join(k for k, v in unsupported.items() if v))
    prompts_per_step = train.batch_size // rollout.n_samples
    dtype = "bfloat16" if on_gpu else "float32"
    # one step off: the trainer's GPUs and the engines' apart (verl's defaults: 8 of each); its config finds verl's
    # base config relative to the working folder unless told where it is; its default "bypass mode" would train
    # against the engines' log-probs with a loss of its own in place of CISPO: off, so that it recomputes the old
    # log-probs on the trainer and keeps CISPO, as oxrl does
    placement = (
        [
            f"trainer.n_gpus_per_node={config.run.train_ranks}",
            "rollout.nnodes=1",
            f"rollout.n_gpus_per_node={rollout.engines}",
            "actor_rollout_ref.hybrid_engine=False",
            "hydra.searchpath=[pkg://verl.trainer.config]",
            "algorithm.rollout_correction.bypass_mode=False",
        ]
        if one_step_off
        else [f"trainer.n_gpus_per_node={gpus}"]
    )
    return [
        *placement,
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "trainer.use_v1=False",
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['train']}",
        f"data.train_batch_size={prompts_per_step}",
        f"data.max_prompt_length={rollout.max_prompt_len}",
        f"data.max_response_length={rollout.max_tokens}",
        "data.truncation=error",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={config.model.name_or_path}",
        # flash-attn is not in the stack: padded batches through SDPA (oxrl packs its micro-batches: varlen)
        "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        # and without flash-attn's cross-entropy kernel verl takes log-probs from the logits one token at a time
        # (logprobs_from_logits_v2: up to 20,000 kernel launches a micro-batch; 2% MFU on an H200): its own fused kernels
        # take them from the hidden states and the head in chunks instead
        "actor_rollout_ref.model.use_fused_kernels=True",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={config.model.gradient_checkpointing}",
        f"actor_rollout_ref.actor.optim.lr={train.lr}",
        f"actor_rollout_ref.actor.optim.weight_decay={train.weight_decay}",
        f"actor_rollout_ref.actor.grad_clip={train.max_grad_norm}",
        # one optimizer step a training step, over all of the step's samples
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts_per_step}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={train.micro_batch_size}",
        "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
        f"actor_rollout_ref.actor.loss_agg_mode={cispo.loss_agg}",
        f"actor_rollout_ref.actor.clip_ratio_low={cispo.clip_low}",
        f"actor_rollout_ref.actor.clip_ratio_high={cispo.clip_high}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.actor.fsdp_config.model_dtype={dtype}",
        # verl holds a micro-batch's float32 logits whole (oxrl's fused head never does): at oxrl's 4 x 32 sequences of
        # 640 tokens one copy is 46 GiB, out of memory on an H200, so its log-prob pass takes the training micro-batch
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={train.micro_batch_size}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={rollout.n_samples}",
        f"actor_rollout_ref.rollout.temperature={rollout.temperature}",
        f"actor_rollout_ref.rollout.top_p={rollout.top_p}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={rollout.gpu_memory_utilization}",
        f"reward.custom_reward_function.path={paths['reward']}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[console]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={paths['train'].parent / 'verl-checkpoints'}",
        "trainer.project_name=vs_verl",
        "trainer.experiment_name=vs_verl",
        f"trainer.device={'cuda' if on_gpu else 'cpu'}",
    ]


STACK = ("verl", "torch", "vllm", "transformers", "tensordict", "ray", "flash-attn")

# each phase's timer; the refresh is `sync_rollout_weights` in the one-step-off-policy trainer
VERL_PHASES = {
    "generate": ("timing_s/gen",),
    "reward": ("timing_s/reward",),
    "logprobs": ("timing_s/old_log_prob",),
    "train": ("timing_s/update_actor",),
    "refresh": ("timing_s/update_weights", "timing_s/sync_rollout_weights"),
}


def parse_verl_log(text: str, samples: int, prompt_tokens: int) -> list[dict]:
    """verl's console logger prints each step as `step:N - key:value - ...`; these as vs_trl's per-step records."""
    steps = []
    for line in text.splitlines():
        match = re.search(r"step:(\d+) - (.*)", line)
        if not match:
            continue
        metrics = {}
        for item in match.group(2).split(" - "):
            key, _, value = item.rpartition(":")
            # numpy scalars print as `np.float64(54.9)`
            value = re.sub(r"^np\.\w+\((.*)\)$", r"\1", value.strip())
            try:
                metrics[key.strip()] = float(value)
            except ValueError:
                pass
        if "timing_s/step" not in metrics:
            continue
        phases = {p: next((metrics[k] for k in keys if k in metrics), 0.0) for p, keys in VERL_PHASES.items()}
        step_s = metrics["timing_s/step"]
        steps.append(
            {
                "step_s": step_s,
                **{f"time_{p}_s": s for p, s in phases.items()},
                "time_other_s": step_s - sum(phases.values()),
                "samples": samples,
                "generated_tokens": metrics.get("response_length/mean", 0.0) * samples,
                # the actor's torch peak, as oxrl's trainer_peak_memory_gb
                "prompt_tokens": prompt_tokens,
                "trainer_peak_memory_gb": metrics.get("actor/perf/max_memory_allocated_gb"),
                # mean(rollout logprob - trainer logprob) over response tokens, as oxrl's logprob_gap_kl
                "rollout_vs_trainer_kl": metrics.get("rollout_corr/kl"),
            }
        )
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--steps", type=int, help="steps per side (default 4; --smoke: 2)")
    parser.add_argument(
        "--smoke", action="store_true", help="CPU: prepare the tiny model's work and write verl's inputs"
    )
    parser.add_argument("--verl-site", type=Path, help="verl's own package folder, first on its PYTHONPATH")
    parser.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget for all the steps")
    parser.add_argument("--verl-timeout-s", type=float, default=420.0, help="verl's time, at most")
    parser.add_argument(
        "--side",
        choices=["both", "verl", "oxrl"],
        default="both",
        help="run one side only (verl starts in about 5 minutes on an H200, so both sides of 3 steps "
        "outgrow a 10-minute call); the report takes the other side's results, from an earlier "
        "call with the same --out and --gpus, if there are any",
    )
    parser.add_argument("--long-tail", action="store_true", help="rl_step.py's long-tailed response lengths")
    parser.add_argument("--child", choices=["prepare", "oxrl"], help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of rl_step.yaml, applied to both sides")
    args = parse_args(parser)
    if args.child:
        run_child(args, {"prepare": child_prepare, "oxrl": child_oxrl})
        return
    start = time.monotonic()
    left = lambda: args.budget_s - (time.monotonic() - start)
    script = Path(__file__).resolve()
    passthrough = [
        "--out",
        str(args.out),
        "--steps",
        str(args.steps),
        "--gpus",
        str(args.gpus),
        *(["--smoke"] if args.smoke else []),
        *(["--long-tail"] if args.long_tail else []),
        "--",
        *args.overrides,
    ]
    rc = {"prepare": _run_child("prepare", passthrough, args.out, min(240.0, left()), script=script)}
    if rc["prepare"] != 0:
        sys.exit(f"prepare failed (rc {rc['prepare']}); see {args.out / 'prepare.log'}")

    from transformers import AutoTokenizer
    from vs_trl import _resolved_run

    run = _resolved_run(args)
    config, model_path = run.config, run.model_path
    paths = write_verl_inputs(config, AutoTokenizer.from_pretrained(model_path), args.out)
    import torch

    on_gpu = torch.cuda.is_available()
    overrides = verl_overrides(config, paths, args.gpus, args.steps, on_gpu)
    (args.out / "verl_overrides.txt").write_text("\n".join(overrides) + "\n")
    print(f"verl's inputs: {paths['train']}, {paths['reward']}; its overrides: {args.out / 'verl_overrides.txt'}")
    if args.smoke:
        return
    ran = ("verl", "oxrl") if args.side == "both" else (args.side,)
    for side in ran:
        (args.out / f"{side}.json").unlink(missing_ok=True)
    if "verl" in ran:
        rc["verl"] = run_verl(args, overrides, config, min(args.verl_timeout_s, left() - 200 * ("oxrl" in ran)))
    if "oxrl" in ran:
        rc["oxrl"] = _run_child("oxrl", passthrough, args.out, left(), script=script)
    # a side not run now: an earlier call's, of the same GPU count
    verl, oxrl = [
        result if (result := _load(args.out / f"{side}.json") or {}).get("gpus") == args.gpus else {}
        for side in ("verl", "oxrl")
    ]
    ratio = {
        key: oxrl[key] / verl[key] if isinstance(oxrl.get(key), float) and verl.get(key) else None
        for key in ("step_s", *(f"time_{p}_s" for p in PHASES), "generate_tokens_per_s", "train_tokens_per_s")
    }
    speedup = verl["step_s"] / oxrl["step_s"] if verl.get("step_s") and oxrl.get("step_s") else None
    report = {
        "verl": verl,
        "oxrl": oxrl,
        "ratio_oxrl_over_verl": ratio,
        "speedup_verl_step_over_oxrl_step": speedup,
        "return_codes": rc,
        "overrides": args.overrides,
        "verl_overrides": overrides,
    }
    _write(args.out / "vs_verl.json", report)
    for key, r in ratio.items():
        print(f"{key:28s} verl {verl.get(key)!s:>22s}  oxrl {oxrl.get(key)!s:>22s}  oxrl/verl {r}")
    print(f"speed-up, verl step / oxrl step: {speedup}")


def versions_under(env: dict) -> dict:
    """The versions of the packages a process of this interpreter started with `env` imports: those on its
    PYTHONPATH first (verl's folder holds its own transformers), then this interpreter's."""
    path = [*filter(None, env.get("PYTHONPATH", "").split(os.pathsep)), *sys.path]
    return {
        name: next((d.version for d in importlib.metadata.distributions(name=name, path=path)), None) for name in STACK
    }


def run_verl(args, overrides: list[str], config, timeout: float) -> int:
    """verl's trainer in its own process group (its Ray cluster ends with it); its per-step metrics from its log, to
    verl.json; its return code."""
    _wait_for_free_gpu()
    # verl 0.9.1 patches TRL's value-head model in every actor it builds whenever TRL can be imported, and fails on
    # TRL 1.16 (staged for vs_trl.py), which no longer has that model: its processes (Ray's workers inherit the
    # PYTHONPATH) start without TRL
    hide_trl = args.out / "verl-without-trl"
    hide_trl.mkdir(exist_ok=True)
    (hide_trl / "sitecustomize.py").write_text('import sys\n\nsys.modules["trl"] = None  # verl sees no TRL\n')
    site = [str(args.verl_site)] if args.verl_site else []
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hide_trl), *site, *filter(None, [os.environ.get("PYTHONPATH")])]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
    }
    print(f"== verl (at most {timeout:.0f} s)", flush=True)
    began = time.monotonic()
    with open(args.out / "verl.log", "w") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", verl_entry(config), *overrides],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=args.out,
        )
        try:
            rc = child.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            rc = 124
        finally:
            _end_group(child)
    print(f"   verl: rc {rc} in {time.monotonic() - began:.0f} s", flush=True)
    samples = config.train.batch_size
    steps = parse_verl_log(
        (args.out / "verl.log").read_text(errors="replace"), samples, samples * config.rollout.max_prompt_len
    )
    # the largest over the steps that logged it; None where none did
    worst = {
        key: max((s[key] for s in steps if s[key] is not None), default=None)
        for key in ("trainer_peak_memory_gb", "rollout_vs_trainer_kl")
    }
    verl = {
        "side": "verl",
        "gpus": args.gpus,
        "versions": versions_under(env),
        "device": _device(),
        "per_step": steps,
        **summarize(steps),
        **worst,
    }
    _write(args.out / "verl.json", verl)
    return rc


if __name__ == "__main__":
    main()
