"""How many graphs oxrl's compiled decoder layers make under ZeRO-3 on 2 GPUs, and why each one recompiled: a probe.

rl_step.py's 0.5B-shape model and config with `deepspeed.zero_stage=3 model.compile=true`, one TrainEngine a GPU (one
child process each, ZeRO's collectives between them), three steps of train_phase.py's synthetic micro-batches (the
logprobs pass, then the CISPO train step). Rank 0's step times and the compiler's graph count go to
OUT/report0.txt; the compiler's recompile reasons (TORCH_LOGS=recompiles) to OUT/child0.txt and the rank logs.
One graph per pass (with and without gradients) is the goal; a layer that recompiles shows which guard failed.

    python benchmarks/probes/zero3_recompiles.py OUT [--recompile-limit N] [--sequences S]
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from rl_step import prepare
from train_phase import loss_args, micro_batches
from train_step_profile import timed_step

from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.cluster.bundles import free_port
from oxrl_core.config.load import load_config
from oxrl_core.config.schema import RLConfig
from oxrl_core.resolve.checks import trainer_spec
from oxrl_core.resolve.run import resolve_run
from oxrl_core.training.engine import TrainEngine

OVERRIDES = ["deepspeed.zero_stage=3", "model.compile=true"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--recompile-limit", type=int, default=8, help="the compiler's (8 is torch's default)")
    parser.add_argument("--sequences", type=int, default=64, help="sequences a rank trains a step")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # set for the child processes
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    config_path = args.out / "work" / "rl_step.yaml"
    if args.rank is None:  # the parent: the model once, then one child a GPU
        args.out.mkdir(parents=True, exist_ok=True)
        if not config_path.exists():
            prepare(args.out / "work", steps=1, shape="0.5b", gpus=2)
        resolve_run("rl", config_path, OVERRIDES)  # checked with both GPUs in sight
        port = free_port()
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    str(args.out),
                    "--recompile-limit",
                    str(args.recompile_limit),
                    "--sequences",
                    str(args.sequences),
                    "--rank",
                    str(rank),
                    "--port",
                    str(port),
                ],
                env={**os.environ, "CUDA_VISIBLE_DEVICES": str(rank), "TORCH_LOGS": "recompiles"},
                stdout=open(args.out / f"child{rank}.txt", "w"),
                stderr=subprocess.STDOUT,
            )
            for rank in range(2)
        ]
        sys.exit(max(child.wait() for child in children))
    torch._dynamo.config.recompile_limit = args.recompile_limit
    config = load_config(RLConfig, config_path, OVERRIDES)
    engine = TrainEngine(
        trainer_spec(config, ALGORITHMS[config.train.alg]),
        config.model.name_or_path,
        args.rank,
        2,
        ("127.0.0.1", args.port),
        args.out / "logs",
    )
    # each rank makes both ranks' micro-batches (the same seeded ones) and trains its own; the loss's normalisers count
    # them all
    per_rank = micro_batches(config, args.sequences)
    batches, loss = (
        per_rank[args.rank],
        loss_args(config, [batch for rank_batches in per_rank for batch in rank_batches]),
    )
    report = open(args.out / f"report{args.rank}.txt", "w")
    for step in range(3):
        logprobs_s, train_s = timed_step(engine, batches, loss)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        print(
            f"step {step}: logprobs {logprobs_s:.3f} s train {train_s:.3f} s graphs {graphs}", file=report, flush=True
        )
    os._exit(0)  # not the interpreter's exit: DeepSpeed's process group may hang it


if __name__ == "__main__":
    main()
