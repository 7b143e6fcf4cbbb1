"""The fused head and packed micro-batches inside TrainEngine, on 2 DeepSpeed ranks (gloo, CPU): the same logprobs,
entropies, values and full parameter gradients as the padded logits path they replaced, for ZeRO 0, 2 and 3, tied
and untied output layers, LoRA, and PPO's value head with a reference model and gradient checkpointing."""

import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from oxrl_core.cluster.ports import free_port

pytestmark = pytest.mark.integration

# Each rank builds, per case, two engines from the same config and seed: one runs the logits path as `_forward` did
# before the fused head and packing (padded sdpa attention, the model's logits, then token_logprobs_and_entropy), the
# other `_forward` (packed, fused). Both take one backward of the same loss over the real tokens of this rank's batch;
# DeepSpeed averages the gradients over the ranks.
RANK = """
import gc, sys
from pathlib import Path
import torch
from deepspeed.utils import safe_get_full_grad
from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.config.schema import RLConfig
from oxrl_core.training import fused_head
from oxrl_core.resolve.checks import trainer_spec
from oxrl_core.training.engine import TrainEngine
from oxrl_core.training.logprobs import token_logprobs, token_logprobs_and_entropy

rank, port, tied, untied, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], Path(sys.argv[5])
fused_head.CHUNK = 5 * 437  # the tiny vocabulary: 16 positions in chunks of 5 (5+5+5+1), slices of 136 columns
CASES = {  # ZeRO-3 last: a live HfDeepSpeedConfig would build the other stages' models partitioned
    "zero0": (tied, {"deepspeed": {"zero_stage": 0}}),
    "zero2": (tied, {"deepspeed": {"zero_stage": 2}}),
    "zero3": (tied, {"deepspeed": {"zero_stage": 3}}),
    "zero3-untied": (untied, {"deepspeed": {"zero_stage": 3}}),
    "zero3-lora": (tied, {"deepspeed": {"zero_stage": 3}, "lora": {"enabled": True, "r": 4, "target_modules": ["q_proj", "v_proj"]}}),
    "zero3-ppo": (untied, {"deepspeed": {"zero_stage": 3}, "train": {"alg": "ppo", "ppo": {"kl_coeff": 0.1}},
                           "model": {"gradient_checkpointing": True}}),
}
TEMPERATURE = 0.7
g = torch.Generator().manual_seed(rank)
inputs = {"input_ids": torch.randint(0, 437, (2, 9), generator=g), "attention_mask": torch.ones(2, 9, dtype=torch.long)}
inputs["attention_mask"][1, 6:] = 0  # right padding
weights = torch.randn(3, 2, 8, generator=g) * inputs["attention_mask"][:, 1:]  # the loss's weights: real tokens only


def run(path, spec, fused):
    attention = "varlen" if fused else "sdpa"
    config = RLConfig.model_validate({**spec, "model": {"dtype": "float32", "attn_implementation": attention, **spec.get("model", {})},
        "train": {"lr": 1e-2, "batch_size": 4, "micro_batch_size": 2, "grad_accum": 1, **spec.get("train", {})},
        "data": {"train": [{"path": "unused.jsonl"}]}})
    engine = TrainEngine(trainer_spec(config, ALGORITHMS[config.train.alg]), path, rank, 2, ("127.0.0.1", port), out / "logs")
    engine.engine.train()
    head = engine.policy_head
    shards = [head is not None and head.weight.numel() == 0]  # ZeRO-3: outside the head's own call, an empty shard
    if fused:
        batch = engine._to_device(inputs)  # packed here, as the engine's steps do
        outputs = engine._forward(batch, TEMPERATURE, entropy="grad")
        logprobs, entropy, values = outputs["logprobs"], outputs["entropy"], outputs.get("values")
        with torch.no_grad():
            reference = engine._forward(batch, TEMPERATURE, reference=True)["logprobs"] if engine.reference is not None else None
    else:
        output = engine.engine(**inputs, use_cache=False)
        logits, values = output if isinstance(output, tuple) else (output.logits, None)
        logprobs, entropy = token_logprobs_and_entropy(logits, inputs["input_ids"], TEMPERATURE)
        values = None if values is None else values[:, :-1]
        with torch.no_grad():
            reference = token_logprobs(engine.reference(**inputs, use_cache=False).logits, inputs["input_ids"],
                                       TEMPERATURE) if engine.reference is not None else None
    shards.append(head is not None and head.weight.numel() == 0)
    loss = (logprobs * weights[0]).sum() + (entropy * weights[1]).sum()
    engine.engine.backward(loss + ((values * weights[2]).sum() if values is not None else 0))
    real = inputs["attention_mask"][:, 1:]  # padding's values differ: zero when packed, whatever padded
    result = {"logprobs": logprobs.detach() * real, "entropy": entropy.detach() * real,
              "reference": None if reference is None else reference * real,
              "values": None if values is None else values.detach() * real,
              "grads": {n: safe_get_full_grad(p).clone() for n, p in engine.engine.module.named_parameters() if p.requires_grad},
              "has_head": head is not None, "shards": shards}
    del engine
    gc.collect()
    return result


torch.save({name: {"before": run(path, spec, False), "fused": run(path, spec, True)} for name, (path, spec) in CASES.items()},
           out / f"rank{rank}.pt")
"""


def untied_copy(tiny_model_dir, folder):
    """oxrl-tiny with an output layer of its own (as Qwen2.5-7B has; 0.5B ties it, as oxrl-tiny does)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, tie_word_embeddings=False)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight * 1.5)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return folder


def test_fused_head_gives_the_logits_path_s_values_and_gradients_under_zero_0_2_and_3_on_two_ranks(
    tmp_path, tiny_model_dir
):
    untied = untied_copy(tiny_model_dir, tmp_path / "untied")
    port = free_port()
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), str(port), str(tiny_model_dir), str(untied), str(tmp_path)],
            env={**os.environ, "DS_ACCELERATOR": "cpu"},
        )
        for rank in (0, 1)
    ]
    assert [rank.wait(timeout=600) for rank in ranks] == [0, 0], (tmp_path / "logs" / "rank0.log").read_text()[-3000:]
    for rank in (0, 1):
        for case, result in torch.load(tmp_path / f"rank{rank}.pt", weights_only=False).items():
            before, fused = result["before"], result["fused"]
            # before and after the forward: so the fused op ran where the weight was gathered
            assert fused["has_head"] and fused["shards"] == [case.startswith("zero3")] * 2, case
            for key in ("logprobs", "entropy", "values", "reference"):
                if before[key] is not None or fused[key] is not None:
                    torch.testing.assert_close(fused[key], before[key], atol=1e-5, rtol=0, msg=f"{case} {key}")
            assert fused["grads"].keys() == before["grads"].keys() and len(fused["grads"]) > 0, case
            for name, grad in before["grads"].items():
                assert grad.abs().sum() > 0 or "lora_A" in name, f"{case} {name}"  # LoRA's B starts at 0: A gets none
                torch.testing.assert_close(fused["grads"][name], grad, atol=1e-5, rtol=1e-5, msg=f"{case} {name}")
