"""Where a colocated weight refresh's time goes on one GPU: a benchmark, never a test.

rl_step.py's model and config (with KEY=VALUE overrides), its TrainGroup and RolloutPool as the loop builds them;
then, five times each: the whole `RolloutPool.refresh` as the loop calls it, and its parts one by one: the trainer
sharing its weights (CUDA IPC), the engine loading them through vLLM's `reload_weights` (what oxrl called until
2026-11-25) and through the model's `load_weights` in place, vLLM's prefix-cache reset, and the trainer releasing
its copies. Medians in seconds to OUT/refresh_profile.json.

    python benchmarks/refresh_profile.py OUT [KEY=VALUE ...]
"""

import json
import statistics
import sys
import time
from pathlib import Path

import ray
import torch
from rl_step import prepare

from oxrl_core.cluster.session import ray_cluster
from oxrl_core.resolve.run import resolve_run
from oxrl_core.rollout.pool import RolloutPool
from oxrl_core.training.deepspeed_setup import model_dtype
from oxrl_core.training.engine import TrainEngine
from oxrl_core.training.group import TrainGroup
from oxrl_core.weights.transport import open_ipc


def _timed_in_worker(worker, load: str, handles: dict) -> float:
    """Inside vLLM's worker: the seconds one load of the shared weights takes, GPU work included."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    if load == "reload_weights":
        worker.model_runner.reload_weights(weights_iterator=open_ipc(handles))
    else:
        worker.model_runner.get_model().load_weights(open_ipc(handles))
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _load(engine, load: str, handles: dict) -> float:
    return engine.llm.collective_rpc(_timed_in_worker, args=(load, handles))[0]


def _reset_prefix_cache(engine) -> float:
    start = time.perf_counter()
    engine.llm.reset_prefix_cache()
    return time.perf_counter() - start


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    _, _, config_path = prepare(out / "work", steps=1, shape="0.5b")
    run = resolve_run("rl", config_path, sys.argv[2:])
    config, model_path = run.config, run.model_path
    times: dict[str, list[float]] = {}

    def timed(key: str, fn):
        start = time.perf_counter()
        result = fn()
        times.setdefault(key, []).append(time.perf_counter() - start)
        return result

    with ray_cluster(run.placement, config.run.hang_timeout_s) as reservation:
        group = TrainGroup(run.trainer, model_path, out / "logs", reservation)
        # as the loop (loops/harness.py) builds it: the trainer's dtype, KV caches sized for a step's samples
        pool = RolloutPool(
            config.rollout,
            model_path,
            str(model_dtype(config.model)).removeprefix("torch."),
            config.train.seed,
            config.train.batch_size,
            config.run.hang_timeout_s,
            out / "logs",
            reservation,
            group,
        )
        engine = pool.workers[0]
        assert pool.weight_buckets == 1, "the parts are timed for a model of one bucket (rollout.weight_bucket_mb)"
        for version in range(1, 6):
            timed("refresh (the loop's call)", lambda: pool.refresh(version))
            handles = timed(
                "share_weights (trainer)",
                lambda: group.call(TrainEngine.share_weights, [True], bucket=0, bucket_bytes=pool.bucket_bytes)[0],
            )
            for load in ("reload_weights", "load_weights"):
                seconds = timed(
                    f"load via {load} (engine call)", lambda: ray.get(engine.__ray_call__.remote(_load, load, handles))
                )
                times.setdefault(f"load via {load} (in the worker)", []).append(seconds)
            times.setdefault("reset_prefix_cache (in the engine)", []).append(
                ray.get(engine.__ray_call__.remote(_reset_prefix_cache))
            )
            timed("release_shared_weights (trainer)", lambda: group.call(TrainEngine.release_shared_weights))
        group.shutdown()
    result = {key: statistics.median(values[1:]) for key, values in times.items()}  # the first refresh allocates
    (out / "refresh_profile.json").write_text(
        json.dumps(
            {"device": torch.cuda.get_device_name(0), "overrides": sys.argv[2:], "median_s": result, "all_s": times},
            indent=2,
        )
    )
    for key, value in result.items():
        print(f"{key:40s} {value * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
