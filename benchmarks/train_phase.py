"""The RL training phase alone, variant by variant: a benchmark, never a test.

The model and config of `rl_step.py` (built under --out when missing);
synthetic rollouts of the same size (512 sequences of 128 + 512 tokens). Each
variant is a set of config overrides; its train step (CISPO) and old-logprob pass
are timed over 3 steps after 1 warm-up, through the same TrainGroup as the loop.
Also times the logprobs op alone, forward + backward: oxrl's Triton kernels and its per-row float32 path
against a full [B, T, V] float32 log-softmax (the naive baseline).

    python benchmarks/train_phase.py --out DIR "VARIANT" ["VARIANT" ...]   # VARIANT: "k=v k=v" or "base"
"""

import argparse
import json
import time
from pathlib import Path

import torch

from oxrl_core.config import load_rl_config
from oxrl_core.loops.rl import _loss_kwargs
from oxrl_core.placement import ray_cluster
from oxrl_core.training.group import TrainGroup
from oxrl_core.training.logprobs import _rows_backward, _rows_forward, token_logprobs
from rl_step import prepare

PEAK_FLOPS = 989e12
SEQUENCES, PROMPT, RESPONSE, VOCAB = 512, 128, 512, 151936


def micro_batches(config) -> list[list[dict]]:
    g = torch.Generator().manual_seed(0)
    size, ranks = config.train.micro_batch_size, config.run.train_ranks
    mask = torch.zeros(size, PROMPT + RESPONSE - 1)
    mask[:, PROMPT - 1:] = 1
    batches = []
    for _ in range(SEQUENCES // size):
        ids = torch.randint(0, VOCAB, (size, PROMPT + RESPONSE), generator=g)
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": mask.clone(),
                        "advantages": torch.randn(size, generator=g)})
    per_rank = len(batches) // ranks
    return [batches[r * per_rank:(r + 1) * per_rank] for r in range(ranks)]


def time_variant(config_path: Path, overrides: list[str], model_flops: float, attention_flops: float) -> dict:
    config, model_path = load_rl_config(config_path, overrides)
    with ray_cluster(config) as reservation:
        return time_group(TrainGroup(config, model_path, config_path.parent / "train-phase-logs", reservation), config,
                          overrides, model_flops, attention_flops)


def time_group(group: TrainGroup, config, overrides: list[str], model_flops: float, attention_flops: float) -> dict:
    per_rank = micro_batches(config)
    kwargs = _loss_kwargs(config, float(SEQUENCES * RESPONSE), SEQUENCES)
    logprob_s, train_s = [], []
    for step in range(3):
        start = time.perf_counter()
        old = group.call("token_logprobs", per_rank)
        logprob_s.append(time.perf_counter() - start)
        for rank_batches, rank_old in zip(per_rank, old):
            for batch, logprobs in zip(rank_batches, rank_old):
                batch["old_logprobs"] = logprobs
        start = time.perf_counter()
        result = group.call("train_step", per_rank, alg="cispo", loss_kwargs=kwargs, with_entropy=True)[0]
        train_s.append(time.perf_counter() - start)
    group.shutdown()
    train, logprobs = sum(train_s[1:]) / 2, sum(logprob_s[1:]) / 2  # after the warm-up step
    return {"overrides": overrides, "train_s": train, "logprobs_s": logprobs,
            "train_mfu": 3 * model_flops / train / PEAK_FLOPS, "logprobs_mfu": model_flops / logprobs / PEAK_FLOPS,
            "train_mfu_with_attention": 3 * (model_flops + attention_flops) / train / PEAK_FLOPS,
            "peak_memory_gb": result.get("peak_memory_gb")}


def logprobs_op(batch: int = 16) -> dict:
    """Forward + backward of the logprobs op on bf16 logits [batch, 640, V]: seconds and peak memory of a full
    float32 log-softmax, of the per-row float32 path (oxrl's CPU path) and of the Triton kernels (its CUDA path),
    and the largest difference of the Triton kernels' logprobs and gradients from the float32 log-softmax's."""
    logits = torch.randn(batch, PROMPT + RESPONSE, VOCAB, device="cuda", dtype=torch.bfloat16).requires_grad_()
    ids = torch.randint(0, VOCAB, (batch, PROMPT + RESPONSE), device="cuda")
    weights = torch.randn(batch, PROMPT + RESPONSE - 1, device="cuda")

    def naive():
        log_p = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        return log_p.gather(-1, ids[:, 1:, None]).squeeze(-1)

    def rows():
        with torch.no_grad():
            logprobs, lse, _ = _rows_forward(logits, ids[:, 1:], 1.0, False)
            logits.grad = _rows_backward(logits, ids[:, 1:], lse, weights, 1.0)

    out = {}
    for name, fn in (("full_fp32_log_softmax", lambda: (naive() * weights).sum().backward()), ("per_row_fp32", rows),
                     ("triton", lambda: (token_logprobs(logits, ids) * weights).sum().backward())):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            logits.grad = None
        out[name] = {"seconds": sorted(times)[2], "extra_peak_gb": (torch.cuda.max_memory_allocated() - base) / 2**30}
    (naive() * weights).sum().backward()
    reference_logprobs, reference_grad = naive().detach(), logits.grad
    logits.grad = None
    (token_logprobs(logits, ids) * weights).sum().backward()
    out["triton_max_abs_error"] = {"logprobs": (token_logprobs(logits, ids) - reference_logprobs).abs().max().item(),
                                   "grad": (logits.grad.float() - reference_grad.float()).abs().max().item()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("variants", nargs="+")
    args = parser.parse_args()
    _, _, config_path = prepare(args.out, steps=1, shape="0.5b")
    from safetensors.torch import load_file

    n_params = sum(t.numel() for t in load_file(args.out / "qwen2.5-0.5b-shape" / "model.safetensors").values())
    model_flops = 2 * n_params * SEQUENCES * (PROMPT + RESPONSE)  # one forward
    # PaLM's MFU (arXiv 2204.02311, appendix B) also counts attention's QK^T and AV: 4 L (H Q) T per token per
    # forward, over the full (unmasked) T x T as PaLM does
    model_config = json.loads((args.out / "qwen2.5-0.5b-shape" / "config.json").read_text())
    seq = PROMPT + RESPONSE
    attention_flops = 4 * model_config["num_hidden_layers"] * model_config["hidden_size"] * seq * SEQUENCES * seq
    results = {"logprobs_op": logprobs_op(), "variants": []}
    print(json.dumps(results["logprobs_op"]))
    for variant in args.variants:
        overrides = [] if variant == "base" else variant.split()
        try:
            results["variants"].append(time_variant(config_path, overrides, model_flops, attention_flops))
        except Exception as e:  # one failing variant (out of memory, say) must not lose the others
            results["variants"].append({"overrides": overrides, "error": repr(e)[:500]})
        print(json.dumps(results["variants"][-1]), flush=True)
    (args.out / "train_phase.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
