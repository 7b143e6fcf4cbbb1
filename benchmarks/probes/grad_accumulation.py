"""How exactly DeepSpeed sums a step's micro-batch gradients in bf16 training: a measurement, never a test.

One rank, a 2-layer Qwen2 model in bf16, 32 micro-batches a step, DeepSpeed configured as `deepspeed_config` does it
(ZeRO 0-2, bf16) with plain SGD at learning rate 1 as the client optimizer and no clipping: the change of the float32
master weights over one step is the gradient the optimizer was given. It is compared with the float64 sum of the same
bf16 micro-batch gradients (the same model, one micro-batch at a time), so what differs is the accumulation alone:
in the model's dtype (DeepSpeed's default) or in float32 (`data_types.grad_accum_dtype: fp32`).

    python benchmarks/probes/grad_accumulation.py --out results/ [--seeds 0 1 2]
"""

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

MICRO_BATCHES = 32
VARIANTS = [(0, "bf16"), (1, "bf16"), (2, "bf16"), (1, "fp32"), (2, "fp32")]  # ZeRO stage, accumulation dtype


def measure(stage: int, accumulation: str, seed: int, port: int) -> dict:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", DS_ACCELERATOR="cpu"
    )
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        )
    ).to(torch.bfloat16)
    batches = [torch.randint(0, 256, (2, 32)) for _ in range(MICRO_BATCHES)]
    exact = [torch.zeros_like(p, dtype=torch.float64) for p in model.parameters()]
    for ids in batches:  # each micro-batch's bf16 gradient, scaled as DeepSpeed scales it, summed in float64
        model.zero_grad(set_to_none=True)
        (model(input_ids=ids, labels=ids).loss / MICRO_BATCHES).backward()
        for total, p in zip(exact, model.parameters()):
            total += p.grad.double()
    model.zero_grad(set_to_none=True)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    import deepspeed

    from oxrl_core.algs.registry import ALGORITHMS
    from oxrl_core.config.schema import SLConfig
    from oxrl_core.resolve.checks import trainer_spec
    from oxrl_core.training.deepspeed_setup import deepspeed_config

    run = SLConfig.model_validate(
        {  # bf16 with DeepSpeed's overflow check, as an SL run has it
            "data": {"train": [{"path": "unused.jsonl"}]},
            "model": {"dtype": "bfloat16"},
            "deepspeed": {"zero_stage": stage},
            "train": {"batch_size": 2 * MICRO_BATCHES, "micro_batch_size": 2, "grad_accum": MICRO_BATCHES},
        }
    )
    config = deepspeed_config(trainer_spec(run, ALGORITHMS[run.train.alg]))
    config["gradient_clipping"] = 0.0  # the probe's: no clipping (DeepSpeed's 0), so the update is the gradient itself
    config["zero_allow_untested_optimizer"] = True  # the probe's: SGD as the client optimizer
    if accumulation == "fp32":  # the probe's variable: micro-batch gradients summed in float32
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    deepspeed.init_distributed(dist_backend="gloo")
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0), config=config)
    optimizer = engine.optimizer

    def master_weights() -> torch.Tensor:  # flat, in parameter order (the flat partitions may end in padding)
        for flat in ("single_partition_of_fp32_groups", "fp32_groups_flat_partition"):  # ZeRO 1-2; the BF16 optimizer
            if hasattr(optimizer, flat):
                return torch.cat([g.detach().double() for g in getattr(optimizer, flat)])
        return torch.cat([p.detach().double().flatten() for group in optimizer.fp32_groups for p in group])  # ZeRO-0

    before = master_weights()
    for ids in batches:
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    want = torch.cat([g.flatten() for g in exact])
    got = (before - master_weights())[: want.numel()]
    return {
        "zero_stage": stage,
        "accumulation": accumulation,
        "seed": seed,
        "optimizer": type(optimizer).__name__,
        "relative_error": ((got - want).norm() / want.norm()).item(),
        "largest_error_over_largest_gradient": ((got - want).abs().max() / want.abs().max()).item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--variant", nargs=3, help=argparse.SUPPRESS
    )  # stage accumulation seed, in a process of its own
    args = parser.parse_args()
    if args.variant:
        stage, accumulation, seed = int(args.variant[0]), args.variant[1], int(args.variant[2])
        print(json.dumps(measure(stage, accumulation, seed, 29650 + 10 * stage + seed)))
        return
    results = []
    for seed in args.seeds:
        for stage, accumulation in VARIANTS:
            done = subprocess.run(
                [sys.executable, __file__, "--out", str(args.out), "--variant", str(stage), accumulation, str(seed)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode or not lines:
                raise SystemExit(f"ZeRO-{stage} {accumulation} failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(lines[-1]))
            print(lines[-1])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grad_accumulation.json").write_text(
        json.dumps(
            {
                "torch": importlib.import_module("torch").__version__,
                "deepspeed": importlib.import_module("deepspeed").__version__,
                "micro_batches": MICRO_BATCHES,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
