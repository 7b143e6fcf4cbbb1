"""Would the fused head be faster with its softmax work inside the product's epilogue? A probe, never a test.

The fused head (oxrl_core/training/fused_head.py) makes the logits a chunk at a time with cuBLAS, writes them to
memory, and runs a Triton kernel over them: in the forward it reads each chunk once (logsumexp, the target's logit,
the entropy); in the backward it makes each vocabulary slice again, g = hidden @ W[slice]^T [N, v], overwrites g
with its gradient, (onehot - p) * grad / T (a read and a write), and reads g in two products. On an H100 the train
pass is 1-4 points of MFU below an H200's, whose only advantage is memory bandwidth (benchmarks/RESULTS.md), and
these passes over the logits are the training phase's largest memory traffic. Here a Triton matmul does that work
on each [BLOCK_M, BLOCK_N] tile of logits (rounded to the weight's dtype, as cuBLAS's output would be) before, or
instead of, storing it:
- forward: per row and vocabulary tile, the max, the sum of exponentials and the entropy's weighted sum, reduced
  over the tiles afterwards ([N, V / BLOCK_N] floats): no logits in memory at all;
- backward: the tile's gradient is stored in place of its logits: one write of each slice instead of three passes.

Measured at rl_step.py's micro-batch (32 sequences of 640 tokens, Qwen2.5-0.5B's hidden size and vocabulary):
seconds of today's steps against the fused kernels in each of a few tile shapes (the backward over every vocabulary
slice as it is cut today), and their largest differences (forward: logprobs and entropies, absolute; backward: in
units of the largest gradient entry). The entropy's gradient term (PPO's bonus only) is left out of the backward.

    python benchmarks/probes/head_epilogue_probe.py --out DIR          # on a GPU
    TRITON_INTERPRET=1 python benchmarks/probes/head_epilogue_probe.py --out DIR --tiny   # the arithmetic, on a CPU
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
from oxrl_core.training.fused_head import width
from oxrl_core.training.logprobs import rows_backward, rows_forward

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): Hopper-sized tiles, each timed (Triton's autotuner needs a GPU driver,
# which the interpreter has not)
CONFIGS = [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 256, 64, 4, 4), (128, 128, 64, 4, 4)]
TINY_CONFIG = (32, 32, 16, 4, 1)


@triton.jit
def _logits_tile(
    hidden, weight, m, n, rows, columns, size, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    """The logits hidden[m] @ weight[n]^T [BLOCK_M, BLOCK_N] in float32, rounded to the inputs' dtype as the separate
    product stores them; hidden [rows, size] and weight [columns, size] row-major."""
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, size, BLOCK_K):
        a = tl.load(
            hidden + m[:, None] * size + start + k[None, :],
            mask=(m[:, None] < rows) & (start + k[None, :] < size),
            other=0.0,
        )
        b = tl.load(
            weight + n[None, :] * size + start + k[:, None],
            mask=(n[None, :] < columns) & (start + k[:, None] < size),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    return acc.to(hidden.dtype.element_ty).to(tl.float32)


@triton.jit
def _logits_grad_kernel(
    hidden,
    weight,
    out,
    targets,
    lse,
    grad,
    rows,
    columns,
    size,
    first_column,
    inv_temperature,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out [rows, columns] = (onehot(target - first_column) - exp(x / T - lse)) * grad / T, x = hidden @ weight^T in the
    weight's dtype; hidden [rows, size], weight [columns, size] (the slice), both row-major."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    x = _logits_tile(hidden, weight, m, n, rows, columns, size, BLOCK_M, BLOCK_N, BLOCK_K) * inv_temperature
    row_lse = tl.load(lse + m, mask=m < rows, other=0.0)
    scale = tl.load(grad + m, mask=m < rows, other=0.0) * inv_temperature
    onehot = tl.where(n[None, :] + first_column == tl.load(targets + m, mask=m < rows, other=-1)[:, None], 1.0, 0.0)
    g = scale[:, None] * (onehot - tl.exp(x - row_lse[:, None]))
    tl.store(
        out + m[:, None] * columns + n[None, :],
        g.to(out.dtype.element_ty),
        mask=(m[:, None] < rows) & (n[None, :] < columns),
    )


@triton.jit
def _logits_partials_kernel(
    hidden,
    weight,
    targets,
    picked,
    tile_max,
    tile_sum,
    tile_weighted,
    rows,
    vocab,
    size,
    tiles,
    inv_temperature,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Per row and per vocabulary tile of x = hidden @ weight^T / T (the whole vocabulary, no logits stored): the tile's
    max, sum of exp(x - max) and sum of exp(x - max) x (for the entropy) into [rows, tiles] partials; the target's
    x into picked [rows] from the tile that holds it."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    tile = tl.program_id(1)
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = n[None, :] < vocab
    x = tl.where(
        inside,
        _logits_tile(hidden, weight, m, n, rows, vocab, size, BLOCK_M, BLOCK_N, BLOCK_K) * inv_temperature,
        float("-inf"),
    )
    row_max = tl.max(x, 1)  # [BLOCK_M]
    p = tl.exp(x - row_max[:, None])  # 0 outside the vocabulary
    live = m < rows
    tl.store(tile_max + m * tiles + tile, row_max, mask=live)
    tl.store(tile_sum + m * tiles + tile, tl.sum(p, 1), mask=live)
    tl.store(tile_weighted + m * tiles + tile, tl.sum(tl.where(inside, p * x, 0.0), 1), mask=live)
    target = tl.load(targets + m, mask=live, other=-1)
    here = live & (target >= tile * BLOCK_N) & (target < tile * BLOCK_N + BLOCK_N)
    tl.store(picked + m, tl.sum(tl.where(n[None, :] == target[:, None], x, 0.0), 1), mask=here)


def forward_today(hidden, weight, targets, temperature) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused head's forward as fused_head.py runs it: logits [n, V] a chunk of rows at a time, then the row
    kernel. Logprobs and entropies [N]."""
    step = width(len(weight))
    chunks = [
        rows_forward(
            F.linear(hidden[start : start + step], weight)[None], targets[None, start : start + step], temperature, True
        )
        for start in range(0, len(hidden), step)
    ]
    return torch.cat([c[0].flatten() for c in chunks]), torch.cat([c[2].flatten() for c in chunks])


def forward_fused(hidden, weight, targets, temperature, config) -> tuple[torch.Tensor, torch.Tensor]:
    """The same from per-tile partials of the product's epilogue, reduced over the tiles here: [N, V / BLOCK_N]."""
    block_m, block_n, block_k, warps, stages = config
    rows, vocab = len(hidden), len(weight)
    tiles = triton.cdiv(vocab, block_n)
    tile_max, tile_sum, tile_weighted = (torch.empty(rows, tiles, device=hidden.device) for _ in range(3))
    picked = torch.empty(rows, device=hidden.device)
    _logits_partials_kernel[(triton.cdiv(rows, block_m), tiles)](
        hidden,
        weight,
        targets,
        picked,
        tile_max,
        tile_sum,
        tile_weighted,
        rows,
        vocab,
        hidden.shape[1],
        tiles,
        1.0 / temperature,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
        num_stages=stages,
    )
    row_max = tile_max.amax(1, keepdim=True)  # [N, 1]
    rescale = torch.exp(tile_max - row_max)  # [N, tiles]
    total = (tile_sum * rescale).sum(1)
    lse = row_max.squeeze(1) + torch.log(total)
    return picked - lse, lse - (tile_weighted * rescale).sum(1) / total  # H = lse - E_p[x]


def backward_today(hidden, weight, targets, lse, grad, temperature) -> list[torch.Tensor]:
    """The backward's first two steps as fused_head.py runs them: each slice's gradient of the logits [N, v]."""
    step, slices = width(len(hidden)), []
    for start in range(0, len(weight), step):
        g = F.linear(hidden, weight[start : start + step])  # [N, v], then overwritten by its own gradient
        # no entropy gradient: the entropies argument goes unread (lse stands in)
        rows_backward(g[None], (targets - start)[None], lse[None], grad[None], temperature, lse[None], None, g[None])
        slices.append(g)
    return slices


def backward_fused(hidden, weight, targets, lse, grad, temperature, config) -> list[torch.Tensor]:
    """The same, each slice's gradient made in the product's epilogue, with tiles `config`."""
    block_m, block_n, block_k, warps, stages = config
    step, slices = width(len(hidden)), []
    for start in range(0, len(weight), step):
        w = weight[start : start + step]
        g = torch.empty(len(hidden), len(w), dtype=hidden.dtype, device=hidden.device)
        _logits_grad_kernel[(triton.cdiv(len(hidden), block_m), triton.cdiv(len(w), block_n))](
            hidden,
            w,
            g,
            targets,
            lse,
            grad,
            len(hidden),
            len(w),
            hidden.shape[1],
            start,
            1.0 / temperature,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            num_warps=warps,
            num_stages=stages,
        )
        slices.append(g)
    return slices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--tiny", action="store_true", help="a small float32 case that Triton's interpreter runs on a CPU"
    )
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
    results = {
        "rows": rows,
        "size": size,
        "vocab": vocab,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
    }
    configs = [TINY_CONFIG] if args.tiny else CONFIGS
    name = lambda direction, c: f"{direction}_fused_epilogue_{'x'.join(map(str, c))}"
    variants = {"forward_today": partial(forward_today, hidden, weight, targets, temperature)}
    variants |= {
        name("forward", c): partial(forward_fused, hidden, weight, targets, temperature, config=c) for c in configs
    }
    variants |= {"backward_today": partial(backward_today, hidden, weight, targets, lse, grad, temperature)}
    variants |= {
        name("backward", c): partial(backward_fused, hidden, weight, targets, lse, grad, temperature, config=c)
        for c in configs
    }
    outputs = {}
    for variant, fn in variants.items():
        times = []
        for _ in range(1 if args.tiny else 6):  # the first call compiles
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            output = fn()
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        # backward: each slice's logits gradient [N, v], joined [N, V]; forward: (logprobs, entropies) [N] each
        outputs[variant] = torch.cat(output, dim=1).float() if variant.startswith("backward") else torch.stack(output)
        del output
        results[f"{variant}_s"] = statistics.median(times[1:] or times)
    for direction in ("forward", "backward"):
        reference = outputs.pop(f"{direction}_today")
        for variant in [v for v in outputs if v.startswith(direction)]:
            difference = (outputs.pop(variant) - reference).abs()
            # backward: relative to the largest gradient entry; forward: absolute, [logprobs, entropies]
            results[f"{variant}_largest_difference"] = (
                (difference.max() / reference.abs().max()).item()
                if direction == "backward"
                else difference.amax(-1).tolist()
            )
    print(json.dumps(results))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "head_epilogue_probe.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
