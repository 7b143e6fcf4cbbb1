"""The RL training phase alone, variant by variant: a benchmark, never a test.

The model and config of `rl_step.py` (built under --out when missing) for --shape and --gpus (one trainer rank a
GPU, no vLLM engine); synthetic rollouts of the same size (512 sequences of 128 + 512 tokens a GPU). Each
variant is a set of config overrides; its train step (CISPO) and old-logprob pass
are timed over --steps steps after 1 warm-up, through the same TrainGroup as the loop; MFU is per GPU.
First the output layer + logprobs op alone, forward + backward (`head_op`): oxrl's fused head against the logits
path it replaced and a full [B, T, V] float32 log-softmax (the naive baseline), with the fused head's differences
from the logits path (float32: within 1e-5; bf16).

    python benchmarks/train_phase.py --out DIR [--shape 7b] [--gpus 2] [--steps 3] "VARIANT" ["VARIANT" ...]
                                                          # VARIANT: "k=v k=v" or "base"
"""

import argparse
import json
import math
import time
from pathlib import Path

import torch
from rl_step import QWEN25_SHAPES, prepare
from torch.nn import functional as F

from oxrl_core.algs.base import GlobalBatch
from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.cluster.session import ray_cluster
from oxrl_core.config.load import load_config
from oxrl_core.config.schema import RLConfig
from oxrl_core.resolve.run import resolve_run
from oxrl_core.training.engine import TrainEngine
from oxrl_core.training.fused_head import fused_token_logprobs
from oxrl_core.training.group import TrainGroup
from oxrl_core.training.logprobs import token_logprobs_and_entropy

PEAK_FLOPS = 989e12
SEQUENCES, PROMPT, RESPONSE, VOCAB, HIDDEN = 512, 128, 512, 151936, 896
ALG = "cispo"  # the loss every train step here runs


def loss_args(config, micro_batches: list[dict]):
    """CISPO's loss arguments for one step over `micro_batches`: every rank's of the step, in one flat list."""
    return ALGORITHMS[ALG].args(
        config.train.settings, GlobalBatch(micro_batches, max_tokens=float(config.rollout.max_tokens))
    )


def micro_batches(config, sequences: int = SEQUENCES) -> list[list[dict]]:
    """Each rank's `sequences` sequences, in micro-batches."""
    g = torch.Generator().manual_seed(0)
    size = config.train.micro_batch_size
    mask = torch.zeros(size, PROMPT + RESPONSE - 1)
    mask[:, PROMPT - 1 :] = 1
    ranks = []
    for _ in range(config.run.train_ranks):
        batches = []
        for _ in range(sequences // size):
            ids = torch.randint(0, VOCAB, (size, PROMPT + RESPONSE), generator=g)
            batches.append(
                {
                    "input_ids": ids,
                    "attention_mask": torch.ones_like(ids),
                    "response_mask": mask.clone(),
                    "advantages": torch.randn(size, generator=g),
                }
            )
        ranks.append(batches)
    return ranks


def time_variant(
    config_path: Path, overrides: list[str], model_flops: float, attention_flops: float, steps: int, sequences: int
) -> dict:
    """The variant's overrides, then the batch that `sequences` a rank in its micro-batches make."""
    variant = load_config(RLConfig, config_path, overrides)  # unchecked: its batch arithmetic is set below
    train, ranks = variant.train, variant.run.train_ranks
    run = resolve_run(
        "rl",
        config_path,
        [
            *overrides,
            f"train.batch_size={ranks * sequences}",
            f"train.grad_accum={sequences // train.micro_batch_size}",
        ],
    )
    with ray_cluster(run.placement, run.config.run.hang_timeout_s) as reservation:
        return time_group(
            TrainGroup(run.trainer, run.model_path, config_path.parent / "train-phase-logs", reservation),
            run.config,
            overrides,
            model_flops,
            attention_flops,
            steps,
            sequences,
        )


def time_group(
    group: TrainGroup,
    config,
    overrides: list[str],
    model_flops: float,
    attention_flops: float,
    steps: int = 2,
    sequences: int = SEQUENCES,
) -> dict:
    """`model_flops`, `attention_flops`: one forward over one rank's `sequences`."""
    per_rank = micro_batches(config, sequences)
    # the loss's normalisers count every rank's micro-batches: ranks x `sequences` rows of RESPONSE tokens
    args = loss_args(config, [batch for rank_batches in per_rank for batch in rank_batches])
    logprob_s, train_s = [], []
    for _ in range(1 + steps):
        start = time.perf_counter()
        old = group.call(TrainEngine.token_logprobs, per_rank)
        logprob_s.append(time.perf_counter() - start)
        for rank_batches, rank_old in zip(per_rank, old):
            for batch, logprobs in zip(rank_batches, rank_old):
                batch["old_logprobs"], batch["is_weights"] = logprobs, torch.ones_like(logprobs)  # no correction
        start = time.perf_counter()
        result = group.call(TrainEngine.train_step, per_rank, loss=ALGORITHMS[ALG].loss, args=args, with_entropy=True)[
            0
        ]
        train_s.append(time.perf_counter() - start)
    group.shutdown()
    train, logprobs = sum(train_s[1:]) / steps, sum(logprob_s[1:]) / steps  # after the warm-up step
    return {
        "overrides": overrides,
        "train_s": train,
        "logprobs_s": logprobs,
        "train_s_each": train_s,
        "train_tokens_per_s_per_gpu": sequences * (PROMPT + RESPONSE) / (train + logprobs),
        "train_mfu": 3 * model_flops / train / PEAK_FLOPS,
        "logprobs_mfu": model_flops / logprobs / PEAK_FLOPS,
        "train_mfu_with_attention": 3 * (model_flops + attention_flops) / train / PEAK_FLOPS,
        "peak_memory_gb": result.get("peak_memory_gb"),
    }


def head_op(batch: int = 16) -> dict:
    """Forward + backward of the output layer and the logprobs and entropies at Qwen2.5-0.5B's shape: bf16 hidden
    states [batch, 640, 896] and weight [151936, 896], a loss weighting both outputs per token. Seconds and extra peak
    memory of the naive float32 log-softmax of the logits, of the logits path (bf16 logits [batch, 640, V], then the
    Triton kernels: the engine before the fused head) and of the fused head (the engine now). Then how far the fused
    head is from the logits path, in float32 (hidden and weight in float32, 4 sequences: logprobs and entropies must
    agree within 1e-5) and in bf16, where both are also held to the float32 log-softmax of the same bf16 inputs (a
    chunk's product may round a bf16 logit one unit away from the whole product's): largest absolute differences of
    the values, of the gradients relative to the largest gradient entry."""
    g = torch.Generator(device="cuda").manual_seed(0)
    seq = PROMPT + RESPONSE
    hidden = torch.randn(batch, seq, HIDDEN, device="cuda", generator=g).bfloat16()
    weight = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=g) * 0.1).bfloat16()  # logits of std 3
    ids = torch.randint(0, VOCAB, (batch, seq), device="cuda", generator=g)
    loss_weights = torch.randn(2, batch, seq - 1, device="cuda", generator=g)

    def naive(h, w, ids):
        log_p = torch.log_softmax(F.linear(h, w)[:, :-1].float(), dim=-1)
        return log_p.gather(-1, ids[:, 1:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)

    variants = {
        "full_fp32_log_softmax": naive,
        "logits_path": lambda h, w, ids: token_logprobs_and_entropy(F.linear(h, w), ids),
        "fused_head": lambda h, w, ids: fused_token_logprobs(h, w, ids, with_entropy=True),
    }

    def run(fn, h, w, n=batch):
        """(logprobs, entropy, grad_hidden, grad_weight) of the first n sequences."""
        h, w = h[:n].detach().requires_grad_(), w.detach().requires_grad_()
        logprobs, entropy = fn(h, w, ids[:n])
        ((logprobs * loss_weights[0, :n]).sum() + (entropy * loss_weights[1, :n]).sum()).backward()
        return logprobs.detach(), entropy.detach(), h.grad, w.grad

    def differences(got, reference):
        values = {
            name: (a.float() - b.float()).abs().max().item()
            for name, a, b in zip(("logprobs", "entropy"), got, reference)
        }
        return values | {
            name: ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
            for name, a, b in zip(("grad_hidden_rel", "grad_weight_rel"), got[2:], reference[2:])
        }

    out = {}
    for name, fn in variants.items():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            run(fn, hidden, weight)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out[name] = {"seconds": sorted(times)[2], "extra_peak_gb": (torch.cuda.max_memory_allocated() - base) / 2**30}
    fp32 = [run(variants[name], hidden.float(), weight.float(), 4) for name in ("fused_head", "logits_path")]
    bf16 = {name: run(fn, hidden, weight, 4) for name, fn in variants.items()}
    reference = run(naive, hidden.float(), weight.float(), 4)  # float32 all the way, from the same bf16 inputs
    out["fused_vs_logits_path"] = {
        "float32": differences(*fp32),
        "bf16": differences(bf16["fused_head"], bf16["logits_path"]),
        "bf16_fused_vs_fp32": differences(bf16["fused_head"], reference),
        "bf16_logits_path_vs_fp32": differences(bf16["logits_path"], reference),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", choices=sorted(QWEN25_SHAPES), default="0.5b")
    parser.add_argument("--gpus", type=int, default=1, help="trainer ranks, one a GPU, each with 512 sequences")
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the warm-up step")
    parser.add_argument("--sequences", type=int, default=SEQUENCES, help="sequences a rank trains a step")
    parser.add_argument("--no-head-op", action="store_true", help="skip the output layer's op alone")
    parser.add_argument("variants", nargs="+")
    args = parser.parse_args()
    model, _, config_path = prepare(args.out, steps=1, shape=args.shape, gpus=args.gpus)
    from safetensors import safe_open

    n_params = 0
    for shard in model.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            n_params += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    model_flops = 2 * n_params * args.sequences * (PROMPT + RESPONSE)  # one forward of one rank's sequences
    # PaLM's MFU (arXiv 2204.02311, appendix B) also counts attention's QK^T and AV: 4 L (H Q) T per token per
    # forward, over the full (unmasked) T x T as PaLM does
    model_config = json.loads((model / "config.json").read_text())
    seq = PROMPT + RESPONSE
    attention_flops = 4 * model_config["num_hidden_layers"] * model_config["hidden_size"] * seq * args.sequences * seq
    results = {"shape": args.shape, "gpus": args.gpus, "device": torch.cuda.get_device_name(0), "variants": []}
    if not args.no_head_op:
        results["head_op"] = head_op()
        print(json.dumps(results["head_op"]))
    for variant in args.variants:
        overrides = [] if variant == "base" else variant.split()
        try:
            results["variants"].append(
                time_variant(config_path, overrides, model_flops, attention_flops, args.steps, args.sequences)
            )
        except Exception as e:  # one failing variant (out of memory, say) must not lose the others
            results["variants"].append({"overrides": overrides, "error": repr(e)[:500]})
        print(json.dumps(results["variants"][-1]), flush=True)
    (args.out / "train_phase.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
