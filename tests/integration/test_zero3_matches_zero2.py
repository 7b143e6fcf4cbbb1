"""ZeRO-3 as oxrl configures it (each decoder layer one leaf module: training/zero3.py:gather_by_block) trains the
weights ZeRO-2 trains: two SFT steps on 2 DeepSpeed ranks (gloo, CPU, float32), full weights (with the README's
prefetch setting), LoRA, and full weights with compiled layers (each layer's forward compiled, DeepSpeed's hooks
outside it); with torch's own linear in the layers, where DeepSpeed's zero.Init leaves its own."""

import os
import subprocess
import sys

import pytest
import torch

from oxrl_core.cluster.ports import free_port

pytestmark = pytest.mark.integration

RANK = """
import sys
from pathlib import Path
import torch
from deepspeed.utils import safe_get_full_fp32_param
from oxrl_core.algs import sft
from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.config.schema import SLConfig
from oxrl_core.data.sft import SFTExample, collate_sft
from oxrl_core.resolve.checks import trainer_spec
from oxrl_core.training.engine import TrainEngine

rank, port, path, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
g = torch.Generator().manual_seed(rank)
examples = [SFTExample(torch.randint(3, 437, (n,), generator=g).tolist(), [0] * 4 + [1] * (n - 4)) for n in (12, 9, 7, 12)]
batches = [collate_sft(examples[i:i + 2], 0) for i in (0, 2)]  # this rank's 2 micro-batches
tokens = 2 * sum(float(b["response_mask"].sum()) for b in batches)  # both ranks' (they draw the same lengths)
results = {}
# (lora, stage, compiled layers); each ZeRO-3 run after its ZeRO-2 one: a live HfDeepSpeedConfig would build
# ZeRO-2's model partitioned
for lora, stage, compiled in ((False, 2, False), (False, 3, False), (True, 2, False), (True, 3, False), (False, 2, True),
                              (False, 3, True)):
    # full weights with the prefetch the README recommends for ZeRO-3 (here: the whole model ahead)
    prefetch = {"stage3_prefetch_bucket_size": 5e8} if stage == 3 and not lora else {}
    config = SLConfig.model_validate({"model": {"dtype": "float32", "compile": compiled},
        "deepspeed": {"zero_stage": stage, "zero_optimization": prefetch},
        "lora": {"enabled": lora, "r": 4, "target_modules": ["q_proj", "v_proj"]},
        "train": {"lr": 1e-2, "batch_size": 8, "micro_batch_size": 2, "grad_accum": 2, "warmup_steps": 0},
        "data": {"train": [{"path": "unused.jsonl"}]}})
    engine = TrainEngine(trainer_spec(config, ALGORITHMS[config.train.alg]), path, rank, 2, ("127.0.0.1", port), out / "logs")
    # torch's own linear, not the one zero.Init leaves behind (engine.py:torch_linear)
    assert torch.nn.functional.linear is torch._C._nn.linear, torch.nn.functional.linear
    losses = [engine.train_step(batches, loss=sft.batch_loss, args=sft.SFTArgs(num_tokens=tokens))["loss"] for _ in range(2)]
    weights = {n: safe_get_full_fp32_param(p).clone() for n, p in engine.engine.module.named_parameters() if p.requires_grad}
    results[(lora, stage, compiled)] = (losses, weights)
    del engine
torch.save(results, out / f"rank{rank}.pt")
"""


def test_two_zero3_steps_give_zero2s_losses_and_weights_with_full_weights_lora_and_compiled_layers(
    tmp_path, tiny_model_dir
):
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), str(port), str(tiny_model_dir), str(tmp_path)],
            env={**os.environ, "DS_ACCELERATOR": "cpu"},
        )
        for rank in (0, 1)
    ]
    assert [rank.wait(timeout=600) for rank in ranks] == [0, 0], (tmp_path / "logs" / "rank0.log").read_text()[-3000:]
    results = torch.load(tmp_path / "rank0.pt", weights_only=False)
    for lora, compiled in ((False, False), (True, False), (False, True)):
        # compiled against compiled: the compiler's kernels round differently from eager ones
        (losses2, weights2), (losses3, weights3) = results[(lora, 2, compiled)], results[(lora, 3, compiled)]
        assert losses2[1] < losses2[0]  # it trains
        assert losses3 == pytest.approx(losses2, rel=1e-5), (lora, compiled)
        assert weights3.keys() == weights2.keys() and weights2
        for name, weight in weights2.items():
            torch.testing.assert_close(
                weights3[name], weight, rtol=1e-5, atol=1e-6, msg=f"lora={lora}, compiled={compiled}: {name}"
            )
