"""The passes without gradients (old and reference logprobs, PPO's values) run consecutive micro-batches as one
forward of train.logprobs_micro_batch_size sequences (by default 4 micro-batches' worth, none under gradient
checkpointing): the same values as one forward per micro-batch, in fewer forwards, packed and padded, under ZeRO-3 too
(real DeepSpeed, one gloo rank on the CPU)."""

import os
import subprocess
import sys

import pytest
import torch

from oxrl_core.cluster.ports import free_port

pytestmark = pytest.mark.integration

# Per case, two engines from the same model: one runs a forward per micro-batch (logprobs_micro_batch_size =
# micro_batch_size), the other the default (4 x micro_batch_size). Each counts its forwards.
RANK = """
import gc, sys
from pathlib import Path
import torch
from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.config.schema import RLConfig
from oxrl_core.resolve.checks import trainer_spec
from oxrl_core.training.engine import TrainEngine

path, port, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
CASES = {  # ZeRO-3 last: a live HfDeepSpeedConfig would build the other stages' models partitioned
    "packed": {"model": {"attn_implementation": "varlen"}},
    "padded": {"model": {"attn_implementation": "sdpa"}},
    "ppo-reference": {"model": {"attn_implementation": "varlen"}, "train": {"alg": "ppo", "ppo": {"kl_coeff": 0.1}}},
    # a checkpointed training micro-batch keeps one layer's activations too: no joining by default
    "checkpointed": {"model": {"attn_implementation": "varlen", "gradient_checkpointing": True}},
    "zero3": {"model": {"attn_implementation": "varlen"}, "deepspeed": {"zero_stage": 3}},
}
g = torch.Generator().manual_seed(0)
micro_batches = []
for size, length in ((2, 9), (2, 6), (2, 11), (1, 7)):  # different lengths; a short last one, as SL's may be
    ids = torch.randint(0, 437, (size, length), generator=g)
    mask = torch.ones(size, length, dtype=torch.long)
    mask[0, length - 2:] = 0  # right padding
    micro_batches.append({"input_ids": ids, "attention_mask": mask})


def run(spec, logprobs_micro_batch_size):
    config = RLConfig.model_validate({**spec, "model": {"dtype": "float32", **spec["model"]},
        "train": {"batch_size": 2, "micro_batch_size": 2, "grad_accum": 1,
                  "logprobs_micro_batch_size": logprobs_micro_batch_size, **spec.get("train", {})},
        "data": {"train": [{"path": "unused.jsonl"}]}})
    engine = TrainEngine(trainer_spec(config, ALGORITHMS[config.train.alg]), path, 0, 1, ("127.0.0.1", port), out / "logs")
    forwards = []
    counted = engine._forward
    engine._forward = lambda batch, *args, **kwargs: forwards.append(len(batch["input_ids"])) or counted(batch, *args, **kwargs)
    if config.train.alg == "ppo":
        logprobs, values = zip(*engine.logprobs_and_values(micro_batches))
        result = {"logprobs": logprobs, "values": values, "reference": engine.token_logprobs(micro_batches, reference=True)}
    else:
        result = {"logprobs": engine.token_logprobs(micro_batches, temperature=0.7)}
    del engine
    gc.collect()
    return result | {"forwards": forwards}


torch.save({name: {"each": run(spec, 2), "joined": run(spec, None)} for name, spec in CASES.items()}, out / "results.pt")
"""


def test_no_grad_passes_join_micro_batches_into_fewer_forwards_with_the_same_values(tmp_path, tiny_model_dir):
    rank = subprocess.run(
        [sys.executable, "-c", RANK, str(tiny_model_dir), str(free_port()), str(tmp_path)],
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
        timeout=600,
    )
    assert rank.returncode == 0, (tmp_path / "logs" / "rank0.log").read_text()[-3000:]
    results = torch.load(tmp_path / "results.pt", weights_only=False)
    for case, result in results.items():
        each, joined = result["each"], result["joined"]
        # 4 micro-batches a forward by default (2 + 2 + 2 + 1 sequences): one forward; PPO's reference pass a second
        assert each["forwards"] == [2, 2, 2, 1] * (2 if case == "ppo-reference" else 1), case
        assert joined["forwards"] == (
            [2, 2, 2, 1] if case == "checkpointed" else [7] * (2 if case == "ppo-reference" else 1)
        ), case
        for key in ("logprobs", "values", "reference"):
            if key not in each:
                continue
            assert [tuple(x.shape) for x in joined[key]] == [(2, 8), (2, 5), (2, 10), (1, 6)], f"{case} {key}"
            for got, expected, batch_mask in zip(joined[key], each[key], (8, 5, 10, 6)):
                real = torch.ones(len(got), batch_mask)
                real[0, batch_mask - 2 :] = 0  # the padded row's positions past its last token
                torch.testing.assert_close(got * real, expected * real, atol=1e-5, rtol=0, msg=f"{case} {key}")
