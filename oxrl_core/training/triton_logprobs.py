"""Per-token logprobs on the GPU in two Triton kernels that read the logits once per pass.

The training phase's logprobs over a 150k vocabulary are memory-bound: bf16 logits
[B, T, V] are 6 GB for 32 x 640 tokens. The forward kernel streams each predicting row
once with an online softmax (running max, rescaled sums: Milakov & Gimelshein 2018,
arXiv 1805.02867), keeping only three floats per row; the backward kernel streams it
once more and writes the gradient, (onehot(target) - softmax(x/T)) * grad / T (plus the
entropy's term when it has a gradient), straight in the logits' dtype. No float32 copy
of a row ever exists.

Both take the predicting rows as a [B, P, V] view (each row contiguous): the logits'
first T-1 positions, or one chunk of the fused head's (`fused_head.py`). The backward
may write over its input: each program reads a block before it writes it.

Works on any device Triton runs on; `logprobs.py` calls it for CUDA tensors and the
tests run it on CPU through Triton's interpreter (TRITON_INTERPRET=1).
"""

import torch
import triton
import triton.language as tl

BLOCK = 4096  # vocabulary entries per loop iteration: 16 per thread with 8 warps


@triton.jit
def _forward_kernel(
    logits,
    stride_b,
    stride_t,
    targets,
    logprobs,
    lse,
    entropy,
    positions,
    vocab,
    inv_temperature,
    WITH_ENTROPY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # one predicting position (b, t) = divmod(row, positions); int64: B*T*V > 2^31
    start = logits + (row // positions) * stride_b + (row % positions) * stride_t
    cols = tl.arange(0, BLOCK)
    running_max = float("-inf")
    total = 0.0  # sum of exp(x - running_max)
    weighted = 0.0  # sum of exp(x - running_max) * x, for the entropy
    for offset in range(0, vocab, BLOCK):
        inside = offset + cols < vocab
        x = tl.load(start + offset + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_temperature
        new_max = tl.maximum(running_max, tl.max(x, 0))
        rescale = tl.exp(running_max - new_max)
        p = tl.exp(x - new_max)  # 0 outside the vocabulary
        total = total * rescale + tl.sum(p, 0)
        if WITH_ENTROPY:
            weighted = weighted * rescale + tl.sum(tl.where(inside, p * x, 0.0), 0)
        running_max = new_max
    row_lse = running_max + tl.log(total)
    target_logit = tl.load(start + tl.load(targets + row)).to(tl.float32) * inv_temperature
    tl.store(logprobs + row, target_logit - row_lse)
    tl.store(lse + row, row_lse)
    if WITH_ENTROPY:
        tl.store(entropy + row, row_lse - weighted / total)  # H = lse - E_p[x]


@triton.jit
def _backward_kernel(
    logits,
    grad_logits,
    stride_b,
    stride_t,
    targets,
    lse,
    grad,
    entropy,
    grad_entropy,
    positions,
    vocab,
    inv_temperature,
    WITH_ENTROPY_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_offset = (row // positions) * stride_b + (row % positions) * stride_t
    scale = tl.load(grad + row) * inv_temperature
    row_lse = tl.load(lse + row)
    target = tl.load(targets + row)  # outside [0, vocab) when the row's target lies in another slice
    if WITH_ENTROPY_GRAD:
        entropy_scale = tl.load(grad_entropy + row) * inv_temperature
        row_entropy = tl.load(entropy + row)
    cols = tl.arange(0, BLOCK)
    for offset in range(0, vocab, BLOCK):
        inside = offset + cols < vocab
        x = tl.load(logits + row_offset + offset + cols, mask=inside, other=0.0).to(tl.float32) * inv_temperature
        log_p = x - row_lse
        p = tl.exp(log_p)
        onehot = tl.where(offset + cols == target, 1.0, 0.0)
        row_grad = scale * (onehot - p)
        if WITH_ENTROPY_GRAD:
            row_grad = row_grad - entropy_scale * p * (log_p + row_entropy)  # dH/dx = -p (log p + H)
        tl.store(grad_logits + row_offset + offset + cols, row_grad.to(grad_logits.dtype.element_ty), mask=inside)


def logprobs_forward(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [B, P, V] (predicting rows, each contiguous), targets [B, P] -> logprobs, logsumexps and entropies
    (or an empty tensor), each float32 [B, P], of softmax(logits / temperature)."""
    batch, positions, vocab = logits.shape
    assert logits.stride(2) == 1
    logprobs = torch.empty(batch, positions, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(logprobs)
    entropy = torch.empty_like(logprobs) if with_entropy else logprobs.new_empty(0)
    _forward_kernel[(batch * positions,)](
        logits,
        logits.stride(0),
        logits.stride(1),
        targets.contiguous(),
        logprobs,
        lse,
        entropy,
        positions,
        vocab,
        1.0 / temperature,
        WITH_ENTROPY=with_entropy,
        BLOCK=BLOCK,
        num_warps=8,
    )
    return logprobs, lse, entropy


def logprobs_backward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    grad: torch.Tensor,
    temperature: float,
    entropy: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """Write the gradient of the logits [B, P, V] into `out` (their shape, strides and dtype; may be `logits`), given
    the logprobs' gradient `grad` [B, P] and, when the entropies [B, P] have one, `grad_entropy` [B, P]:
    (grad (onehot(target) - p) - grad_entropy p (log p + H)) / T, p = softmax(logits / T). A target outside [0, V)
    adds no onehot term (a slice of the vocabulary that does not hold it)."""
    batch, positions, vocab = logits.shape
    assert logits.stride(2) == 1 and out.stride() == logits.stride()
    with_entropy_grad = grad_entropy is not None
    _backward_kernel[(batch * positions,)](
        logits,
        out,
        logits.stride(0),
        logits.stride(1),
        targets.contiguous(),
        lse.contiguous(),
        grad.float().contiguous(),
        entropy.contiguous() if with_entropy_grad else lse,
        grad_entropy.float().contiguous() if with_entropy_grad else lse,
        positions,
        vocab,
        1.0 / temperature,
        WITH_ENTROPY_GRAD=with_entropy_grad,
        BLOCK=BLOCK,
        num_warps=8,
    )
