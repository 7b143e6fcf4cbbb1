"""ZeRO-3 builds a model partitioned (DeepSpeed's zero.Init), which turns every floating tensor made in a module's
__init__ into the training dtype, RoPE's inverse frequencies too: computed there, never loaded from a checkpoint,
in bf16 they were up to 0.6% off (Qwen2.5's: angles off by up to 0.74 rad at position 639). The trainer then disagreed
with vLLM on long sequences: the likely cause of ZeRO-3's logprob gaps on GPUs (0.17 a token for a 7B on H200s
against 0.03 under ZeRO-2, 0.53 for a 32B on H100s; benchmarks/RESULTS.md). Real DeepSpeed, one gloo rank on the CPU,
the tiny model in bf16."""

import os
import subprocess
import sys

import pytest
import torch

from oxrl_core.cluster.ports import free_port

pytestmark = pytest.mark.integration

RANK = """
import gc, sys
from pathlib import Path
import torch
from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.config.schema import RLConfig
from oxrl_core.resolve.checks import trainer_spec
from oxrl_core.training.engine import TrainEngine

path, port, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
ids = torch.randint(0, 437, (1, 900), generator=torch.Generator().manual_seed(0))  # positions up to 899
batch = [{"input_ids": ids, "attention_mask": torch.ones_like(ids)}]


def run(zero_stage):
    # SGRPO with a KL term: the frozen reference is built (and partitioned) beside the policy
    config = RLConfig.model_validate({"model": {"dtype": "bfloat16"}, "deepspeed": {"zero_stage": zero_stage},
        "train": {"alg": "sgrpo", "sgrpo": {"kl_coeff": 0.1}, "batch_size": 1, "micro_batch_size": 1, "grad_accum": 1},
        "data": {"train": [{"path": "unused.jsonl"}]}})
    engine = TrainEngine(trainer_spec(config, ALGORITHMS[config.train.alg]), path, 0, 1, ("127.0.0.1", port), out / "logs")
    models = {"policy": engine.engine.module, "reference": engine.reference}  # ZeRO-3 wraps the reference ("module.")
    rotary = {f"{which}.{name.removeprefix('module.')}": buffer.cpu() for which, model in models.items()
              for name, buffer in model.named_buffers() if "inv_freq" in name}
    result = {"rotary": rotary, "policy": engine.token_logprobs(batch)[0],
              "reference": engine.token_logprobs(batch, reference=True)[0]}
    del engine
    gc.collect()
    return result


# ZeRO-3 last: a live HfDeepSpeedConfig would build the other stage's models partitioned
results = {"zero1": run(1), "zero3": run(3)}
unimported = {name: sys.modules.get(name) is None for name in ("mlflow", "sklearn")}
torch.save(results | {"unimported": unimported}, out / "results.pt")
"""


@pytest.fixture(scope="module")
def ranks_results(tmp_path_factory, tiny_model_dir) -> dict:
    out = tmp_path_factory.mktemp("zero3-rope")
    rank = subprocess.run(
        [sys.executable, "-c", RANK, str(tiny_model_dir), str(free_port()), str(out)],
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
        timeout=600,
    )
    assert rank.returncode == 0, (out / "logs" / "rank0.log").read_text()[-3000:]
    return torch.load(out / "results.pt", weights_only=False)


def test_zero3_keeps_ropes_inverse_frequencies_in_float32_and_the_logprobs_of_zero1(ranks_results):
    zero1, zero3 = ranks_results["zero1"], ranks_results["zero3"]
    assert zero1["rotary"].keys() == zero3["rotary"].keys() and any(k.startswith("reference.") for k in zero1["rotary"])
    gaps = {which: (zero3[which] - zero1[which]).abs().max().item() for which in ("policy", "reference")}
    print("largest |ZeRO-3 - ZeRO-1| token logprob", gaps)
    for name, buffer in zero3["rotary"].items():
        assert buffer.dtype == torch.float32 and torch.equal(buffer, zero1["rotary"][name]), name
    assert all(gap < 1e-3 for gap in gaps.values())


def test_a_rank_leaves_mlflow_and_sklearn_unimported_though_deepspeed_and_transformers_import_them(ranks_results):
    import importlib.util

    # installed here: DeepSpeed's autotuner would import MLflow, transformers' generation utilities scikit-learn
    assert importlib.util.find_spec("mlflow") is not None and importlib.util.find_spec("sklearn") is not None
    assert ranks_results["unimported"] == {"mlflow": True, "sklearn": True}
