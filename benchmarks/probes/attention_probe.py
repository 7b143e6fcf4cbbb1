"""Is there a faster attention than today's for a packed micro-batch on this GPU? A probe, never a test.

Today a packed micro-batch's attention is torch's `varlen_attn` (FlashAttention-2 kernels): 12% of an H100's kernel
time in rl_step.py's train pass, running far below the GPU's peak at its 640-token sequences and 64-wide heads
(benchmarks/RESULTS.md). This times, forward + backward at rl_step.py's micro-batch (32 sequences, Qwen2.5-0.5B's
14 query and 2 key/value heads of 64), today's call against SDPA over the same sequences right-padded to the longest
[B, H, T, D] with causal masking, by backend (cuDNN's, flash, memory-efficient), the padding and unpadding included;
for each (and today's) the largest difference of the output and the inputs' gradients from a float32 reference (one
SDPA per sequence by the math backend). Right padding needs no mask: under causal attention a real position never
sees the padding after it. Two length mixes: every sequence 640 tokens (rl_step.py's rollouts) and
128 + uniform(0, 512) (responses that stop early).

    python benchmarks/probes/attention_probe.py --out DIR
"""

import argparse
import json
import statistics
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

from oxrl_core.training.attention import flash_varlen_attention

SEQUENCES, HEADS, KV_HEADS, DIM = 32, 14, 2, 64
BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def padded_attention(backend, expand_kv: bool):
    """Packed q [N, Hq, D], k and v [N, Hkv, D] -> [N, Hq, D] through SDPA on the right-padded [B, H, T, D]."""

    def attention(q, k, v, cu_seq_lens, max_length, scale):
        lengths = cu_seq_lens[1:] - cu_seq_lens[:-1]  # [B]
        t = torch.arange(max_length, device=q.device)
        index = (cu_seq_lens[:-1, None] + t).clamp(max=len(q) - 1)  # [B, T] packed row of each padded position
        real = t < lengths[:, None]  # [B, T]
        padded = [x[index].transpose(1, 2) for x in (q, k, v)]  # [B, H, T, D]; the padding holds copies, unseen
        if expand_kv:
            padded[1:] = [x.repeat_interleave(HEADS // KV_HEADS, dim=1) for x in padded[1:]]
        with sdpa_kernel(backend):
            out = scaled_dot_product_attention(*padded, is_causal=True, scale=scale, enable_gqa=not expand_kv)
        out = out.transpose(1, 2)  # [B, T, Hq, D]
        return out[real]  # [N, Hq, D], in packed order

    return attention


def reference(q, k, v, cu_seq_lens, max_length, scale):
    """The same attention in float32 by the math backend, one causal SDPA per sequence."""
    bounds = cu_seq_lens.tolist()
    with sdpa_kernel(SDPBackend.MATH):
        return torch.cat(
            [
                scaled_dot_product_attention(
                    *(x[a:b].transpose(0, 1) for x in (q, k, v)), is_causal=True, scale=scale, enable_gqa=True
                ).transpose(0, 1)
                for a, b in zip(bounds, bounds[1:])
            ]
        )


def varlen_kv_expanded(q, k, v, cu_seq_lens, max_length, scale):
    """Today's call with each key/value head copied for its query heads (no grouped-query heads in the kernel)."""
    k, v = (x.repeat_interleave(HEADS // KV_HEADS, dim=1) for x in (k, v))
    return flash_varlen_attention(q, k, v, cu_seq_lens, max_length, scale)


def largest_differences(values: list, exact: list) -> list[float]:
    """Output and the gradients of q, k, v against the float32 reference's: each one's largest difference, relative to
    the reference's largest entry."""
    return [float((a - b).abs().max() / b.abs().max()) for a, b in zip(values, exact)]


def timed(attention, q, k, v, grad, cu_seq_lens, max_length, repeats=20) -> tuple[float, list]:
    """Median seconds of forward + backward (with the output's gradient `grad`), and the last output and gradients."""
    for _ in range(min(3, repeats)):
        for x in (q, k, v):
            x.grad = None
        attention(q, k, v, cu_seq_lens, max_length, DIM**-0.5).backward(grad)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for x in (q, k, v):
            x.grad = None
        start.record()
        out = attention(q, k, v, cu_seq_lens, max_length, DIM**-0.5)
        out.backward(grad)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times), [out.detach().float(), *(x.grad.float() for x in (q, k, v))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
    }
    mixes = {
        "all_640": torch.full((SEQUENCES,), 640),
        "128_plus_uniform_512": 128 + torch.randint(0, 513, (SEQUENCES,), generator=generator),
    }
    for mix, lengths in mixes.items():
        cu_seq_lens = torch.zeros(SEQUENCES + 1, dtype=torch.int32)
        cu_seq_lens[1:] = lengths.cumsum(0)
        cu_seq_lens, max_length, tokens = cu_seq_lens.cuda(), int(lengths.max()), int(lengths.sum())
        q, k, v = (
            torch.randn(tokens, heads, DIM, device="cuda", dtype=torch.bfloat16).requires_grad_()
            for heads in (HEADS, KV_HEADS, KV_HEADS)
        )
        grad = torch.randn_like(q)  # the output's gradient, the same for every variant
        exact = [x.detach().float().requires_grad_() for x in (q, k, v)]
        _, exact = timed(reference, *exact, grad.float(), cu_seq_lens, max_length, repeats=1)
        today_s, today = timed(flash_varlen_attention, q, k, v, grad, cu_seq_lens, max_length)
        report[f"{mix}_today_varlen_s"] = today_s
        report[f"{mix}_today_varlen_vs_float32"] = largest_differences(today, exact)
        expanded_s, expanded = timed(varlen_kv_expanded, q, k, v, grad, cu_seq_lens, max_length)
        report[f"{mix}_varlen_kv_expanded_s"] = expanded_s
        report[f"{mix}_varlen_kv_expanded_vs_float32"] = largest_differences(expanded, exact)
        for name, backend in BACKENDS.items():
            for expand_kv in (False, True):
                key = f"{mix}_sdpa_{name}{'_kv_expanded' if expand_kv else ''}"
                try:
                    seconds, values = timed(
                        padded_attention(backend, expand_kv), q, k, v, grad, cu_seq_lens, max_length
                    )
                except RuntimeError as error:  # a backend that refuses these inputs says why
                    report[key] = f"refused: {str(error).splitlines()[0][:200]}"
                    continue
                report[f"{key}_s"] = seconds
                report[f"{key}_vs_today"] = today_s / seconds
                report[f"{key}_vs_float32"] = largest_differences(values, exact)
        print(json.dumps({key: value for key, value in report.items() if key.startswith(mix)}), flush=True)
    (out / "attention_probe.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
