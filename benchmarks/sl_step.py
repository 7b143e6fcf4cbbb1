"""SFT steps on a GPU machine, step by step: a benchmark, never a test.

The SL side of the scaling benchmarks beside `rl_step.py`'s RL step: a random-weight model in a Qwen2.5 shape (`--shape`, built as
rl_step.py builds it) trained with SFT through `train` (`oxrl_core.loops.train`), the loop of `oxrl train sl`, on
`--gpus N` trainer ranks under ZeRO-3 (whose shards are what lets the 32B shape train at all; offload by override).
The work per GPU is the RL step's trained tokens: PROMPTS x SAMPLES sequences of PROMPT_TOKENS + NEW_TOKENS tokens
(a prompt of PROMPT_TOKENS, the loss on its completion, cut at data.max_len), in micro-batches of 16. Reported, as the
median over the steps after the first (which compiles and allocates): the step's seconds, tokens/s in all and per GPU
(every token goes forward and backward), MFU (6 N FLOPs per token, 4 N with LoRA, parameters only, against 989
TFLOP/s dense bf16 per GPU) and the largest peak GPU memory of a trainer rank.

    python benchmarks/sl_step.py --out DIR [--shape 0.5b|7b|32b] [--gpus N] [--steps S] [KEY=VALUE ...]
    # overrides as for `oxrl train sl`, e.g. model.gradient_checkpointing=true train.micro_batch_size=2
"""

import json
import statistics
import time
from pathlib import Path

import torch
import yaml
from rich.console import Console
from rl_step import (
    NEW_TOKENS,
    PEAK_FLOPS,
    PROMPT_TOKENS,
    PROMPTS,
    QWEN25_SHAPES,
    SAMPLES,
    _parameter_count,
    build_model,
    keep_logs,
    train_flops_per_token,
    workload_parser,
    write_prompts,
)

from oxrl_core.loops.train import train
from oxrl_core.resolve.run import resolve_run

MICRO_BATCH = 16


def write_sft_records(model: Path, path: Path, count: int) -> Path:
    """`count` prompt-completion records: rl_step's prompts of PROMPT_TOKENS templated tokens, each with a completion
    longer than NEW_TOKENS tokens (data.max_len cuts every sequence at PROMPT_TOKENS + NEW_TOKENS)."""
    records = [json.loads(line) for line in write_prompts(model, path, count).read_text().splitlines()]
    path.write_text(
        "".join(
            json.dumps({"prompt": r["prompt"], "completion": " ".join(str(i % 10) for i in range(NEW_TOKENS + 64))})
            + "\n"
            for r in records
        )
    )
    return path


def main() -> None:
    args = workload_parser(__doc__, "SL", steps=3, shapes=QWEN25_SHAPES).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = build_model(args.out / f"qwen2.5-{args.shape}-shape", QWEN25_SHAPES[args.shape])
    sequences = PROMPTS * SAMPLES * args.gpus
    records = write_sft_records(model, args.out / "sft.jsonl", sequences)
    config_path = args.out / "sl_step.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "model": {"name_or_path": str(model), "dtype": "bfloat16"},
                "data": {"train": [{"path": str(records)}], "max_len": PROMPT_TOKENS + NEW_TOKENS},
                "train": {
                    "alg": "sft",
                    "steps": args.steps,
                    "lr": 1e-6,
                    "lr_scheduler": "constant",
                    "warmup_steps": 0,
                    "batch_size": sequences,
                    "micro_batch_size": MICRO_BATCH,
                    "grad_accum": PROMPTS * SAMPLES // MICRO_BATCH,
                },
                "deepspeed": {"zero_stage": 3},
                "run": {
                    "name": "sl-step",
                    "output_dir": str(args.out / "runs"),
                    "train_ranks": args.gpus,
                    "save_final": False,
                },
            }
        )
    )
    run = resolve_run(
        "sl",
        config_path,
        ["run.name=sl-step-" + time.strftime("%H%M%S"), f"run.save_final={args.save}", *args.overrides],
    )
    summary = train(run, resume=False, console=Console())
    keep_logs(Path(summary["run_dir"]), args.out, args.save)
    history = summary["history"]
    measured = history[1:] or history  # the first step compiles and allocates
    step_s = statistics.median(h["step_time_s"] for h in measured)
    tokens_per_s = statistics.median(h["tokens_per_s"] for h in measured)
    n_params = _parameter_count(model)
    peaks = [h["trainer_peak_memory_gb"] for h in history if "trainer_peak_memory_gb" in h]  # on GPUs
    result = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "gpus": args.gpus,
        "shape": args.shape,
        "overrides": args.overrides,
        "params": n_params,
        "step_s": step_s,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / args.gpus,
        "mfu": train_flops_per_token(run.config, n_params) * tokens_per_s / (PEAK_FLOPS * args.gpus),
        "trainer_peak_memory_gb": max(peaks) if peaks else None,
        "per_step": [
            {key: h.get(key) for key in ("step_time_s", "tokens_per_s", "loss", "trainer_peak_memory_gb")}
            for h in history
        ],
    }
    (args.out / "sl_step.json").write_text(json.dumps(result, indent=2))
    for key in ("step_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "trainer_peak_memory_gb"):
        value = result[key]
        Console().print(f"{key:24s} {'n/a' if value is None else f'{value:,.3f}'}")


if __name__ == "__main__":
    main()
