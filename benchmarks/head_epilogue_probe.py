"""Would the fused head's backward be faster with the softmax gradient inside the product? A probe, never a test.

The fused head's backward (oxrl_core/training/fused_head.py) makes each vocabulary slice of the logits again,
g = hidden @ W[slice]^T [N, v] (cuBLAS, written to memory), then overwrites g with its gradient, (onehot - p) *
grad / T (a Triton kernel: read and write), then reads g in two products. On an H100 the train pass is 1-4 points of
MFU below an H200's, whose only advantage is memory bandwidth (benchmarks/RESULTS.md), and these passes over [N, v]
are the pass's largest memory traffic. Here the gradient is computed in the product's epilogue instead (a Triton
matmul: each [BLOCK_M, BLOCK_N] tile of logits, rounded to the weight's dtype as cuBLAS's output would be, becomes
its gradient before it is stored), which saves one write and one read of every slice.

Measured at rl_step.py's micro-batch (32 sequences of 640 tokens, Qwen2.5-0.5B's hidden size and vocabulary), over
every slice of the vocabulary as the backward cuts it: seconds of today's two steps against the fused kernel in each
of a few tile shapes, and their largest difference (in units of the largest gradient entry). The entropy's gradient
term (PPO's bonus only) is left out of both.

    python benchmarks/head_epilogue_probe.py --out DIR          # on a GPU
    TRITON_INTERPRET=1 python benchmarks/head_epilogue_probe.py --out DIR --tiny   # the arithmetic, on a CPU
"""

import argparse
import json
import statistics
import time
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl
from torch.nn import functional as F

from oxrl_core.training import fused_head
from oxrl_core.training.fused_head import _width
from oxrl_core.training.logprobs import rows_backward, rows_forward


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): Hopper-sized tiles, each timed (Triton's autotuner needs a GPU driver,
# which the interpreter has not)
CONFIGS = [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 256, 64, 4, 4), (128, 128, 64, 4, 4)]
TINY_CONFIG = (32, 32, 16, 4, 1)


@triton.jit
def _logits_grad_kernel(hidden, weight, out, targets, lse, grad, rows, columns, size, first_column, inv_temperature,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out [rows, columns] = (onehot(target - first_column) - exp(x / T - lse)) * grad / T, x = hidden @ weight^T in the
    weight's dtype; hidden [rows, size], weight [columns, size] (the slice), both row-major."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, size, BLOCK_K):
        a = tl.load(hidden + m[:, None] * size + start + k[None, :], mask=(m[:, None] < rows) & (start + k[None, :] < size), other=0.0)
        b = tl.load(weight + n[None, :] * size + start + k[:, None], mask=(n[None, :] < columns) & (start + k[:, None] < size), other=0.0)
        acc = tl.dot(a, b, acc)
    x = acc.to(out.dtype.element_ty).to(tl.float32) * inv_temperature  # the logit as the separate product stores it
    row_lse = tl.load(lse + m, mask=m < rows, other=0.0)
    scale = tl.load(grad + m, mask=m < rows, other=0.0) * inv_temperature
    onehot = tl.where(n[None, :] + first_column == tl.load(targets + m, mask=m < rows, other=-1)[:, None], 1.0, 0.0)
    g = scale[:, None] * (onehot - tl.exp(x - row_lse[:, None]))
    tl.store(out + m[:, None] * columns + n[None, :], g.to(out.dtype.element_ty), mask=(m[:, None] < rows) & (n[None, :] < columns))


def today(hidden, weight, targets, lse, grad, temperature) -> list[torch.Tensor]:
    """The backward's first two steps as fused_head.py runs them: each slice's gradient of the logits [N, v]."""
    step, slices = _width(len(hidden)), []
    for start in range(0, len(weight), step):
        g = F.linear(hidden, weight[start:start + step])  # [N, v], then overwritten by its own gradient
        rows_backward(g[None], (targets - start)[None], lse[None], grad[None], temperature, lse[None], None, g[None])
        slices.append(g)
    return slices


def fused(hidden, weight, targets, lse, grad, temperature, config) -> list[torch.Tensor]:
    """The same, each slice's gradient made in the product's epilogue, with tiles `config`."""
    block_m, block_n, block_k, warps, stages = config
    step, slices = _width(len(hidden)), []
    for start in range(0, len(weight), step):
        w = weight[start:start + step]
        g = torch.empty(len(hidden), len(w), dtype=hidden.dtype, device=hidden.device)
        _logits_grad_kernel[(triton.cdiv(len(hidden), block_m), triton.cdiv(len(w), block_n))](
            hidden, w, g, targets, lse, grad, len(hidden), len(w), hidden.shape[1], start, 1.0 / temperature,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
        slices.append(g)
    return slices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiny", action="store_true", help="a small float32 case that Triton's interpreter runs on a CPU")
    args = parser.parse_args()
    device, dtype = ("cpu", torch.float32) if args.tiny else ("cuda", torch.bfloat16)
    if args.tiny:
        fused_head.CHUNK = 70 * 128  # slices of 128 columns (128 + 128 + 44): the targets' offsets are exercised
    rows, size, vocab = (70, 32, 300) if args.tiny else (32 * 639, 896, 151936)
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(rows, size, device=device, generator=g).to(dtype)
    weight = (torch.randn(vocab, size, device=device, generator=g) * 0.1).to(dtype)
    targets = torch.randint(0, vocab, (rows,), device=device, generator=g)
    grad = torch.randn(rows, device=device, generator=g)
    temperature = 0.7
    _, lse, _ = rows_forward(F.linear(hidden, weight)[None], targets[None], temperature, False)
    lse = lse[0]
    results = {"rows": rows, "size": size, "vocab": vocab, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}
    outputs = {}
    variants = {"today": today} | {f"fused_epilogue_{'x'.join(map(str, c))}": partial(fused, config=c)
                                    for c in ([TINY_CONFIG] if args.tiny else CONFIGS)}
    for name, fn in variants.items():
        times = []
        for _ in range(1 if args.tiny else 6):  # the first call autotunes and compiles
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            slices = fn(hidden, weight, targets, lse, grad, temperature)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        outputs[name] = torch.cat(slices, dim=1).float()  # [N, V]
        del slices
        results[f"{name}_s"] = statistics.median(times[1:] or times)
    reference = outputs.pop("today")
    for name, output in outputs.items():
        results[f"{name}_largest_difference_relative"] = ((output - reference).abs().max() / reference.abs().max()).item()
    print(json.dumps(results))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "head_epilogue_probe.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
