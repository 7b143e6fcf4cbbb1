"""A non-finite gradient in a bf16 run, through DeepSpeed with oxrl's own config (one rank, CPU): the RL engine drops
DeepSpeed's overflow check (training/engine.py), so the norm it reports must still be non-finite for the RL loop to
stop on; the SL engine keeps the check, so DeepSpeed skips that step and the weights stay as they were."""

import json
import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

STEP = """
import importlib, json, os, socket
import torch
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
import deepspeed
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.training.engine import deepspeed_config

importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo")


def nan_step(schema) -> dict:
    config = schema.model_validate({"model": {"dtype": "bfloat16"}, "deepspeed": {"zero_stage": 1},
                                    "train": {"batch_size": 1, "micro_batch_size": 1, "grad_accum": 1},
                                    "data": {"train": [{"path": "unused.jsonl"}]}})
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(torch.bfloat16)
    before = model.weight.detach().clone()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                      optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3), config=deepspeed_config(config))
    finite = engine(torch.randn(1, 8, dtype=torch.bfloat16)).sum()
    engine.backward(finite * float("nan"))
    engine.step()
    return {"grad_norm": float(engine.get_global_grad_norm()), "weights_kept": bool(torch.equal(model.weight.detach(), before))}


print(json.dumps({"rl": nan_step(RLConfig), "sl": nan_step(SLConfig)}))
"""


@pytest.fixture(scope="module")
def nan_steps() -> dict:
    """One bf16 step whose gradient is NaN, under the RL and under the SL engine's DeepSpeed config."""
    result = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_rl_engine_without_the_overflow_check_still_reports_a_nan_gradient_as_non_finite(nan_steps):
    step = nan_steps["rl"]
    assert not math.isfinite(step["grad_norm"]), step
    assert not step["weights_kept"]  # no check, no skip: the loop's stop is what protects the run


def test_sl_engine_keeps_the_overflow_check_and_skips_a_nan_step(nan_steps):
    assert nan_steps["sl"]["weights_kept"], nan_steps["sl"]
