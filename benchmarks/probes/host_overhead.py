"""What DeepSpeed adds to each micro-batch on one rank, by ZeRO stage: a benchmark, never a test.

oxrl's training phase on one GPU is bound by the host (the Python and kernel launches per micro-batch), so a trainer
wrapper's host work per micro-batch is a direct cost. Measured here on the CPU, where nothing hides it: a narrow
model with Qwen2.5-0.5B's tensors (24 decoder layers, 290 parameters; hidden 32, so the arithmetic is negligible),
micro-batches of 2 x 16 tokens, gradient accumulation 8, bf16, one rank:

- plain torch (AdamW, foreach, on the bf16 weights), plain torch as a fair bf16 trainer does it (`master`: float32
  master weights, the gradients cast to them, clipped, AdamW, the bf16 weights copied back) against DeepSpeed with
  ZeRO 0-3 configured as `deepspeed_config` does for an SL run (bf16 with the overflow check, gradient clipping),
  torch AdamW as the client optimizer; and with the decoder layers compiled as oxrl compiles them (`compile_blocks`,
  inductor), where ZeRO-3's hooks on every linear layer cut each layer's graph into pieces; and ZeRO-3 with each
  decoder layer one of its leaf modules (`set_z3_leaf_modules`: one gather and one release a layer, no hooks inside
  it), alone and compiled;
- per accumulating micro-batch (forward + backward + DeepSpeed's step call, no optimizer step): the median host
  seconds, and the aten ops that do work (views and metadata left out; the work inside them, a cast inside `to`,
  counted), counted by torch.profiler;
- per optimizer step: the host seconds and working ops that the last micro-batch of an accumulation adds to one
  before it (the update, clipping, the gradients' bookkeeping), the seconds a median over 6 steps;
- with `--profile`: the DeepSpeed functions that take the host's time in those micro-batches and in the last one
  of an accumulation, which steps the optimizer (cProfile).

Each variant runs in a process of its own with one torch thread.

    python benchmarks/probes/host_overhead.py --out results/ [--profile]
"""

import argparse
import collections
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = [
    "plain",
    "master",
    "zero0",
    "zero1",
    "zero2",
    "zero3",
    "plain+compile",
    "zero1+compile",
    "zero3+compile",
    "zero3+leaf",
    "zero3+leaf+compile",
]
GRAD_ACCUM, MICRO_BATCH, TOKENS = 8, 2, 16
# Ops that only make views or read metadata: no kernel on a GPU.
NO_WORK = {
    "aten::view",
    "aten::reshape",
    "aten::t",
    "aten::transpose",
    "aten::narrow",
    "aten::view_as",
    "aten::detach",
    "aten::_has_compatible_shallow_copy_type",
    "aten::as_strided",
    "aten::slice",
    "aten::select",
    "aten::expand",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::permute",
    "aten::alias",
    "aten::_unsafe_view",
    "aten::lift_fresh",
    "aten::empty",
    "aten::empty_like",
    "aten::result_type",
    "aten::is_nonzero",
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::contiguous",
    "aten::numel",
    "aten::size",
    "aten::stride",
    "aten::is_same_size",
    "aten::to",
}


def working(event) -> bool:
    return event.name.startswith("aten::") and event.name not in NO_WORK


def ancestors(event):
    while event.cpu_parent is not None:
        event = event.cpu_parent
        yield event


def measure(variant: str, profile: bool) -> dict:
    """One variant in this process: host milliseconds and working ops per accumulating micro-batch and per step."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(29600 + VARIANTS.index(variant)),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        DS_ACCELERATOR="cpu",
    )
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from oxrl_core.algs.registry import ALGORITHMS
    from oxrl_core.config.schema import SLConfig
    from oxrl_core.resolve.checks import trainer_spec
    from oxrl_core.training.build import compile_blocks
    from oxrl_core.training.deepspeed_setup import deepspeed_config

    torch.set_num_threads(1)
    torch.manual_seed(0)
    stage, compiled, leaf = variant.split("+")[0], variant.endswith("+compile"), "+leaf" in variant
    shape = Qwen2Config(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=24,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        use_cache=False,
    )
    ids = torch.randint(0, shape.vocab_size, (MICRO_BATCH, TOKENS))
    if stage == "plain":
        model = Qwen2ForCausalLM(shape).to(torch.bfloat16)
        if compiled:
            compile_blocks(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)

        def micro_batch(i: int) -> None:
            (model(input_ids=ids, labels=ids).loss / GRAD_ACCUM).backward()
            if i % GRAD_ACCUM == GRAD_ACCUM - 1:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    elif stage == "master":
        model = Qwen2ForCausalLM(shape).to(torch.bfloat16)
        weights = list(model.parameters())
        masters = [w.detach().float() for w in weights]
        optimizer = torch.optim.AdamW(masters, lr=1e-5, foreach=True)

        def micro_batch(i: int) -> None:
            (model(input_ids=ids, labels=ids).loss / GRAD_ACCUM).backward()
            if i % GRAD_ACCUM == GRAD_ACCUM - 1:
                for master, weight in zip(masters, weights):
                    master.grad = weight.grad.float()
                torch.nn.utils.clip_grad_norm_(masters, 1.0, foreach=True)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                model.zero_grad(set_to_none=True)
                with torch.no_grad():
                    torch._foreach_copy_(weights, masters)
    else:
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # as TrainEngine: not needed
        import deepspeed
        from transformers.integrations import HfDeepSpeedConfig

        run = SLConfig.model_validate(
            {  # bf16 with DeepSpeed's overflow check, as an SL run has it
                "data": {"train": [{"path": "unused.jsonl"}]},
                "model": {"dtype": "bfloat16"},
                "deepspeed": {"zero_stage": int(stage[-1])},
                "train": {
                    "batch_size": MICRO_BATCH * GRAD_ACCUM,
                    "micro_batch_size": MICRO_BATCH,
                    "grad_accum": GRAD_ACCUM,
                    "max_grad_norm": 1.0,
                },
            }
        )
        config = deepspeed_config(trainer_spec(run, ALGORITHMS[run.train.alg]))
        deepspeed.init_distributed(dist_backend="gloo")
        keep = HfDeepSpeedConfig(config)  # noqa: F841 (ZeRO-3 builds the model partitioned while it lives)
        model = Qwen2ForCausalLM(shape).to(torch.bfloat16)
        if leaf:  # each decoder layer one ZeRO-3 module: one gather and one release per layer, no hooks inside it
            from deepspeed.utils import set_z3_leaf_modules

            set_z3_leaf_modules(model, [type(model.model.layers[0])])
        if compiled:
            compile_blocks(model, zero3=stage == "zero3")
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-5), config=config
        )

        def micro_batch(i: int) -> None:
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()

    seconds, step_seconds = [], []  # accumulating micro-batches; the last of each accumulation
    for i in range(7 * GRAD_ACCUM):  # the first GRAD_ACCUM warm up
        start = time.perf_counter()
        micro_batch(i)
        if i >= GRAD_ACCUM:
            (step_seconds if i % GRAD_ACCUM == GRAD_ACCUM - 1 else seconds).append(time.perf_counter() - start)

    def working_ops(i: int) -> collections.Counter:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            micro_batch(i)
        return collections.Counter(e.name for e in prof.events() if working(e) and not any(map(working, ancestors(e))))

    step = 7 * GRAD_ACCUM
    ops = working_ops(step)
    micro_batch(step + 1)
    before_last = working_ops(step + 2)  # one that adds its gradients to the accumulated ones, as the last one does
    for i in range(step + 3, step + GRAD_ACCUM - 1):
        micro_batch(i)
    step_ops = working_ops(step + GRAD_ACCUM - 1)
    step_ops.subtract(before_last)
    step_ops = +step_ops  # the ops the optimizer step adds
    step += GRAD_ACCUM
    import torch._dynamo.utils

    result = {
        "variant": variant,
        "parameters": sum(1 for _ in model.parameters()),
        "compiled_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "host_ms_per_micro_batch": round(statistics.median(seconds) * 1e3, 2),
        "working_ops_per_micro_batch": sum(ops.values()),
        "most_common_ops": ops.most_common(6),
        "host_ms_per_optimizer_step": round((statistics.median(step_seconds) - statistics.median(seconds)) * 1e3, 2),
        "working_ops_per_optimizer_step": sum(step_ops.values()),
        "most_common_step_ops": step_ops.most_common(8),
    }
    if profile and stage not in ("plain", "master"):
        import cProfile
        import pstats

        def deepspeed_own(micro_batches: range) -> tuple[float, list]:
            """DeepSpeed's own host milliseconds per micro-batch over these, and its eight costliest functions."""
            profiler = cProfile.Profile()
            profiler.enable()
            for i in micro_batches:
                micro_batch(i)
            profiler.disable()
            own = sorted(
                (
                    (v[2], f"{k[0].split('deepspeed/')[-1]}:{k[1]} {k[2]}")
                    for k, v in pstats.Stats(profiler).stats.items()
                    if "site-packages/deepspeed/" in k[0]
                ),
                reverse=True,
            )
            per = 1e3 / len(micro_batches)
            return round(sum(s for s, _ in own) * per, 2), [[round(s * per, 3), where] for s, where in own[:8]]

        result["deepspeed_own_ms_per_micro_batch"], result["deepspeed_top"] = deepspeed_own(
            range(step, step + GRAD_ACCUM - 1)
        )
        # the last micro-batch of an accumulation, which steps the optimizer
        result["deepspeed_own_ms_last_micro_batch"], result["deepspeed_top_last"] = deepspeed_own(
            range(step + GRAD_ACCUM - 1, step + GRAD_ACCUM)
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", action="store_true", help="also where DeepSpeed's own host time goes")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # one variant, in a process of its own
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args.variant, args.profile)))
        return
    results = []
    for variant in VARIANTS:
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--out",
                str(args.out),
                "--variant",
                variant,
                *(["--profile"] if args.profile else []),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(lines[-1]))
        print(json.dumps({k: v for k, v in results[-1].items() if not k.startswith(("most_common", "deepspeed_top"))}))
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_overhead.json").write_text(
        json.dumps(
            {
                "torch": torch.__version__,
                "deepspeed": importlib.import_module("deepspeed").__version__,
                "cpu": _cpu_model(),
                "results": results,
            },
            indent=2,
        )
    )


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    main()
