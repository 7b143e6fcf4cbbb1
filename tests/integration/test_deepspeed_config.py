"""DeepSpeed under oxrl's own config (training/deepspeed_setup.py; one rank, CPU, a tiny linear model):
- a non-finite gradient in a bf16 run: the RL engine drops DeepSpeed's overflow check, so the norm it reports must
  still be non-finite for the RL loop to stop on; the SL engine keeps the check, so DeepSpeed skips that step and the
  weights stay as they were;
- no device synchronization per micro-batch: DeepSpeed's throughput timer, on by default, synchronizes in every
  forward and step from the third step on, which on a GPU leaves it idle while the host catches up."""

import json
import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

STEP = """
import importlib, json, os
import torch
from oxrl_core.cluster.ports import free_port
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
import deepspeed
from deepspeed.accelerator import get_accelerator
from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.resolve.checks import trainer_spec
from oxrl_core.training.deepspeed_setup import deepspeed_config

importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo")


def engine_and_model(schema, grad_accum: int):
    config = schema.model_validate({"model": {"dtype": "bfloat16"}, "deepspeed": {"zero_stage": 1},
                                    "train": {"batch_size": grad_accum, "micro_batch_size": 1, "grad_accum": grad_accum},
                                    "data": {"train": [{"path": "unused.jsonl"}]}})
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(torch.bfloat16)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                      optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                                      config=deepspeed_config(trainer_spec(config, ALGORITHMS[config.train.alg])))
    return engine, model


def nan_step(schema) -> dict:
    engine, model = engine_and_model(schema, grad_accum=1)
    before = model.weight.detach().clone()
    finite = engine(torch.randn(1, 8, dtype=torch.bfloat16)).sum()
    engine.backward(finite * float("nan"))
    engine.step()
    return {"grad_norm": float(engine.get_global_grad_norm()), "weights_kept": bool(torch.equal(model.weight.detach(), before))}


def synchronizations(schema) -> int:  # the device synchronizations DeepSpeed asks for in 4 steps of 2 micro-batches
    engine, _ = engine_and_model(schema, grad_accum=2)
    accelerator, count = get_accelerator(), []
    synchronize = accelerator.synchronize
    accelerator.synchronize = lambda *args, **kwargs: count.append(1) or synchronize(*args, **kwargs)
    for _ in range(4 * 2):
        engine.backward(engine(torch.randn(1, 8, dtype=torch.bfloat16)).sum())
        engine.step()
    accelerator.synchronize = synchronize
    return len(count)


print(json.dumps({"rl": nan_step(RLConfig), "sl": nan_step(SLConfig),
                  "synchronizations": {"rl": synchronizations(RLConfig), "sl": synchronizations(SLConfig)}}))
"""


@pytest.fixture(scope="module")
def steps() -> dict:
    """Under the RL and the SL engine's DeepSpeed config: one bf16 step whose gradient is NaN, and four steps counting
    the device synchronizations."""
    result = subprocess.run(
        [sys.executable, "-c", STEP],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_rl_engine_without_the_overflow_check_still_reports_a_nan_gradient_as_non_finite(steps):
    step = steps["rl"]
    assert not math.isfinite(step["grad_norm"]), step
    assert not step["weights_kept"]  # no check, no skip: the loop's stop is what protects the run


def test_sl_engine_keeps_the_overflow_check_and_skips_a_nan_step(steps):
    assert steps["sl"]["weights_kept"], steps["sl"]


def test_deepspeed_never_synchronizes_the_device_per_micro_batch(steps):
    assert steps["synchronizations"] == {"rl": 0, "sl": 0}, steps["synchronizations"]
