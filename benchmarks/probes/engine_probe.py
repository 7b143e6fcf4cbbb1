"""Where one rollout engine's time goes on a GPU, and what more tokens a second it could make: a probe, never a test.

Pipelined RL on two GPUs gives one engine all of a step's 1,024 sequences, and that engine made about 16,800
tokens/s, as each of the default's two colocated engines did with 512 (benchmarks/RESULTS.md). This probe runs
`RolloutEngine.advance` as the run's stream drives it (ADVANCE_STEPS scheduler steps a call) on a random-weight model
of Qwen2.5-0.5B's shape, 128-token prompts, 512 new tokens each (random weights rarely end one), 512 and then 1,024
sequences at once, under variants of vLLM's settings, each in a process of its own:

- `default`: the engine as oxrl starts it (engine core in-process, vLLM's default batch and CUDA graph sizes);
- `graphs1024`: CUDA graphs captured up to 1,024 sequences (vLLM caps capture at 512 by default on Hopper, so a
  decode step of more runs eagerly);
- `multiproc`, `multiproc+graphs1024`: vLLM's engine core in a process of its own, which overlaps the scheduler and
  the model with the output processing of the caller's process;
- `pair`: two default engines sharing one GPU, 512 sequences each at the same time (more engine processes than
  GPUs);
- `profile`: the default's 1,024 sequences under cProfile: the functions that take the engine process's time.

    python benchmarks/probes/engine_probe.py --out results/ [--gpus 2] [--variants default,graphs1024,...]
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import queue
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

VARIANTS = ["default", "graphs1024", "multiproc", "multiproc+graphs1024", "pair", "profile"]
PROMPT_TOKENS, NEW_TOKENS, BATCHES = 128, 512, (512, 1024)
CHILD_TIMEOUT_S = 300


def patch_vllm(variant: str) -> None:
    """`RolloutEngine` builds `vllm.LLM` itself: the variant's settings go in through a subclass put in its place."""
    import vllm

    extra = (
        {"max_num_seqs": 1024, "compilation_config": {"max_cudagraph_capture_size": 1024}}
        if "graphs1024" in variant
        else {}
    )
    multiproc = variant.startswith("multiproc")

    class LLM(vllm.LLM):
        def __init__(self, **kwargs):
            if multiproc:  # RolloutEngine has just set it to 0
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
            super().__init__(**kwargs | extra)

    vllm.LLM = LLM


def child(args) -> None:
    patch_vllm(args.variant)
    from oxrl_core.rollout.engine import RolloutEngine
    from oxrl_core.rollout.records import SampleRequest

    memory = 0.35 if args.variant == "pair" else 0.4
    engine = RolloutEngine(args.model, "bfloat16", PROMPT_TOKENS + NEW_TOKENS, memory, 0, max(BATCHES))
    config = engine.llm.llm_engine.vllm_config
    settings = {
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "async_scheduling": config.scheduler_config.async_scheduling,
        "max_cudagraph_capture_size": config.compilation_config.max_cudagraph_capture_size,
        "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
    }
    rng = random.Random(0)
    vocab = engine.llm.llm_engine.model_config.get_vocab_size()
    prompts = [[rng.randrange(vocab // 2) for _ in range(PROMPT_TOKENS)] for _ in range(max(BATCHES))]
    warm = min(64, max(BATCHES))
    engine.advance([SampleRequest(i, prompts[i], 16, i, 1.0, 1.0) for i in range(warm)], until_done=True)
    batches = (
        [max(BATCHES) // 2] if args.variant == "pair" else [max(BATCHES)] if args.variant == "profile" else BATCHES
    )
    if args.barrier:  # a pair starts generating together
        Path(args.barrier, args.gpu_slot).touch()
        while len(list(Path(args.barrier).iterdir())) < 2:
            time.sleep(0.05)
    results, profile = [], None
    for count in batches:
        requests = [SampleRequest(i, prompts[i], NEW_TOKENS, 1000 + i, 1.0, 1.0) for i in range(count)]
        profiler = cProfile.Profile() if args.variant == "profile" else None
        calls, start, wall_start = 0, time.perf_counter(), time.time()
        if profiler:
            profiler.enable()
        done = engine.advance(requests)
        while len(done) < count:
            done += engine.advance([])
            calls += 1
        if profiler:
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
            profile = text.getvalue()
        seconds = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for c in done)
        results.append(
            {
                "sequences": count,
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_s": tokens / seconds,
                "advance_calls": calls + 1,
                "wall_start": wall_start,
                "wall_end": time.time(),
            }
        )
        print(json.dumps(results[-1]), flush=True)
    Path(args.result).write_text(
        json.dumps({"variant": args.variant, "settings": settings, "batches": results, "profile": profile})
    )
    os._exit(0)  # vLLM's teardown in-process can hang; nothing is left to save


def run_child(script: Path, out: Path, model: str, variant: str, gpu: int, slot: str = "", barrier: str = "") -> dict:
    result = out / f"engine_probe.{variant}{slot}.json"
    log = out / f"engine_probe.{variant}{slot}.log"
    env = os.environ | {"CUDA_VISIBLE_DEVICES": str(gpu)}
    command = [
        sys.executable,
        str(script),
        "--child",
        variant,
        "--model",
        model,
        "--result",
        str(result),
        "--gpu-slot",
        slot or "0",
    ] + (["--barrier", barrier] if barrier else [])
    with log.open("w") as f:
        try:
            rc = subprocess.run(
                command, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=CHILD_TIMEOUT_S
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if result.is_file():
        return json.loads(result.read_text())
    return {"variant": variant, "failed": rc, "log_tail": log.read_text()[-2000:]}


def run_variant(script: Path, out: Path, model: str, variant: str, gpu: int) -> dict:
    if variant != "pair":
        return run_child(script, out, model, variant, gpu)
    barrier = out / "pair-barrier"
    barrier.mkdir(exist_ok=True)
    halves = [None, None]
    threads = [
        threading.Thread(
            target=lambda i=i: halves.__setitem__(i, run_child(script, out, model, "pair", gpu, str(i), str(barrier)))
        )
        for i in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any("failed" in h for h in halves):
        return {"variant": "pair", "failed": [h.get("failed") for h in halves], "halves": halves}
    runs = [h["batches"][0] for h in halves]
    tokens, seconds = (
        sum(r["tokens"] for r in runs),
        max(r["wall_end"] for r in runs) - min(r["wall_start"] for r in runs),
    )
    return {
        "variant": "pair",
        "settings": halves[0]["settings"],
        "halves": runs,
        "batches": [
            {
                "sequences": sum(r["sequences"] for r in runs),
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_s": tokens / seconds,
            }
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child"), parser.add_argument("--model"), parser.add_argument("--result")
    parser.add_argument("--gpu-slot", default="0"), parser.add_argument("--barrier", default="")
    args = parser.parse_args()
    if args.child:
        args.variant = args.child
        return child(args)
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {VARIANTS}")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # rl_step.py lives one folder up, in benchmarks/
    from rl_step import QWEN25_SHAPES, build_model

    args.out.mkdir(parents=True, exist_ok=True)
    model = str(build_model(args.out / "qwen2.5-0.5b-shape", QWEN25_SHAPES["0.5b"]))
    todo, results = queue.Queue(), []
    for v in variants:
        todo.put(v)

    def gpu_worker(gpu: int) -> None:
        while True:
            try:
                variant = todo.get_nowait()
            except queue.Empty:
                return
            result = run_variant(Path(__file__).resolve(), args.out, model, variant, gpu)
            results.append(result)
            rows = [(b["sequences"], round(b["tokens_per_s"])) for b in result.get("batches", [])]
            print(f"{variant} (GPU {gpu}): {result.get('settings')} tokens/s by sequences {rows or result}", flush=True)

    workers = [threading.Thread(target=gpu_worker, args=(g,)) for g in range(args.gpus)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    import torch

    summary = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"), "variants": results}
    (args.out / "engine_probe.json").write_text(json.dumps(summary, indent=1))
    for r in results:
        if r.get("profile"):
            print(r["profile"])


if __name__ == "__main__":
    main()
