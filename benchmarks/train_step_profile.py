"""Where one RL train step's time goes on a GPU: a benchmark, never a test.

rl_step.py's model and config (with KEY=VALUE overrides), train_phase.py's synthetic micro-batches, one TrainEngine a
process (no Ray): this process, or with --ranks N one child process a GPU (ZeRO's collectives between them). Three
timed steps (the first compiles), then torch.profiler over a step of 8 micro-batches on rank 0:
its wall time against the time the GPU was busy (the union of its kernels' intervals), what the host ran while the GPU
was idle, and the ops by CUDA time and by CPU time. Written to OUT/profile.txt.

    python benchmarks/train_step_profile.py OUT [--ranks N] [KEY=VALUE ...]
"""

import argparse
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from rl_step import prepare
from torch.profiler import ProfilerActivity, profile
from train_phase import ALG, loss_args, micro_batches

from oxrl_core.algs.base import LossArgs
from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.cluster.bundles import free_port
from oxrl_core.config.load import load_config
from oxrl_core.config.schema import RLConfig
from oxrl_core.resolve.checks import trainer_spec
from oxrl_core.resolve.run import resolve_run
from oxrl_core.training.engine import TrainEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", type=int, default=1, help="trainer ranks, one GPU each")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # set for the child processes
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "work" / "rl_step.yaml"
    if args.rank is None:  # the parent (or the only rank): the model, and the config checked with every GPU in sight
        prepare(out / "work", steps=1, shape="0.5b", gpus=args.ranks)
        run = resolve_run("rl", config_path, args.overrides)
        config, model_path = run.config, run.model_path
    else:  # a child sees its one GPU: the config its parent checked
        config = load_config(RLConfig, config_path, args.overrides)
        model_path = config.model.name_or_path
    if args.ranks > 1 and args.rank is None:
        port = free_port()
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    str(out),
                    "--ranks",
                    str(args.ranks),
                    "--rank",
                    str(rank),
                    "--port",
                    str(port),
                    *args.overrides,
                ],
                env={**os.environ, "CUDA_VISIBLE_DEVICES": str(rank)},
            )
            for rank in range(args.ranks)
        ]
        sys.exit(max(child.wait() for child in children))
    rank, port = args.rank or 0, args.port or free_port()
    # every rank runs every step (ZeRO's collectives); rank 0 times, profiles and reports
    report = open(out / "profile.txt" if rank == 0 else os.devnull, "w")  # the engine sends stdout to its rank log
    engine = TrainEngine(
        trainer_spec(config, ALGORITHMS[config.train.alg]),
        model_path,
        rank,
        args.ranks,
        ("127.0.0.1", port),
        out / "logs",
    )
    # every rank makes every rank's micro-batches (the same seeded ones) and trains its own; the loss's normalisers
    # count them all
    per_rank = micro_batches(config)
    batches, loss = per_rank[rank], loss_args(config, [batch for rank_batches in per_rank for batch in rank_batches])
    for step in range(3):
        logprobs_s, train_s = timed_step(engine, batches, loss)
        print(f"step {step}: logprobs {logprobs_s:.3f} s train {train_s:.3f} s", file=report, flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) if rank == 0 else nullcontext() as prof:
        start = time.perf_counter()
        engine.train_step(batches[:8], loss=ALGORITHMS[ALG].loss, args=loss, with_entropy=True)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    if rank:
        return
    events = prof.events()
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events if e.device_type.name == "CUDA")
    busy, end, gaps = 0.0, kernels[0][0], []  # microseconds covered by at least one kernel; the idle intervals
    for a, b in kernels:
        if a > end:
            gaps.append((end, a))
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    print(f"8 micro-batches: wall {wall:.3f} s, GPU busy {busy / 1e6:.3f} s ({busy / 1e6 / wall:.1%})", file=report)
    # What the host was running while the GPU waited: the idle time of every gap of 20 us or more summed by the
    # innermost host op open at its middle, then the longest gaps with all the host ops open then, outermost first.
    host = sorted((e for e in events if e.device_type.name == "CPU"), key=lambda e: e.time_range.start)
    middles = sorted((a + b) / 2 for a, b in gaps)
    open_at, active, i = {}, [], 0  # the host ops open at each gap's middle, outermost first, in one sweep
    for middle in middles:
        while i < len(host) and host[i].time_range.start <= middle:
            active.append(host[i])
            i += 1
        active = [e for e in active if e.time_range.end >= middle]
        open_at[middle] = [e.name for e in active] or ["(no host op)"]

    by_op = {}
    for a, b in gaps:
        if b - a >= 20:
            innermost = open_at[(a + b) / 2][-1]
            by_op[innermost] = by_op.get(innermost, 0.0) + b - a
    print(
        f"idle gaps of 20 us or more: {sum(by_op.values()) / 1e3:.1f} ms, by the host's innermost op then:", file=report
    )
    for name, idle in sorted(by_op.items(), key=lambda item: -item[1])[:15]:
        print(f"  {idle / 1e3:8.2f} ms  {name[:110]}", file=report)
    for a, b in sorted(gaps, key=lambda gap: gap[0] - gap[1])[:8]:
        print(f"  gap {(b - a) / 1e3:.2f} ms: {' > '.join(name[:60] for name in open_at[(a + b) / 2])}", file=report)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70), file=report)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70), file=report)
    report.close()


def timed_step(engine: TrainEngine, batches: list[dict], loss: LossArgs) -> tuple[float, float]:
    """One RL step's trainer work on this rank's micro-batches, timed on the device: the old-logprobs pass (which sets
    each batch's `old_logprobs`), then the CISPO train step; (logprobs seconds, train seconds)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for batch, logprobs in zip(batches, engine.token_logprobs(batches)):
        batch["old_logprobs"], batch["is_weights"] = logprobs, torch.ones_like(logprobs)  # no correction
    torch.cuda.synchronize()
    middle = time.perf_counter()
    engine.train_step(batches, loss=ALGORITHMS[ALG].loss, args=loss, with_entropy=True)
    torch.cuda.synchronize()
    return middle - start, time.perf_counter() - middle


if __name__ == "__main__":
    main()
