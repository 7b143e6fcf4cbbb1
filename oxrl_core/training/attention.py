"""The attention of a packed row (`packing.py`) and of a vision tower's windows: each sequence attends only within
itself, by the boundaries `cu_seq_lens` (as flash-attention names them): torch's `varlen_attn` on CUDA in 16 bits, one
SDPA per sequence otherwise. Registered with transformers under the names below when this module is imported, which
`build.py` does before it loads a model with one of them.
"""

import inspect

import torch
from torch.nn.attention.varlen import varlen_attn
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

ATTENTION = "oxrl_varlen"  # the model's attn_implementation when its micro-batches are packed


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    is_causal: bool = True,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface for sequences laid end to end: query [1, Hq, N, D], key and value
    [1, Hkv, N, D] -> [1, N, Hq, D], attention within each sequence of `cu_seq_lens_q`: causal in a decoder's packed
    row, both ways among a vision tower's patches (`is_causal=False`: an image, or a window of one); a sliding-window
    layer's query (Gemma 2 and 3, Mistral's first models) sees the `sliding_window` - 1 tokens before it and itself."""
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [N, H, D]
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):  # flash attention's dtypes
        out = flash_varlen_attention(q, k, v, cu_seq_lens_q, max_length_q, scaling, is_causal, sliding_window)
    else:
        bounds = cu_seq_lens_q.tolist()
        out = torch.cat(
            [
                torch.nn.functional.scaled_dot_product_attention(
                    q[a:b].transpose(0, 1),
                    k[a:b].transpose(0, 1),
                    v[a:b].transpose(0, 1),
                    attn_mask=_band(b - a, sliding_window, q.device) if sliding_window else None,
                    is_causal=is_causal and not sliding_window,
                    scale=scaling,
                    enable_gqa=True,
                ).transpose(0, 1)
                for a, b in zip(bounds, bounds[1:])
            ]
        )
    return out[None], None


def _band(length: int, window: int, device: torch.device) -> torch.Tensor:
    """Causal attention within a sliding window, [length, length] bool: query i sees keys i - window < j <= i."""
    distance = torch.arange(length, device=device)[:, None] - torch.arange(length, device=device)[None]
    return (distance >= 0) & (distance < window)


def flash_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scale: float | None,
    causal: bool = True,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Flash attention over the sequences of `cu_seq_lens`: q [N, Hq, D], k and v [N, Hkv, D] -> [N, Hq, D].
    Grouped-query heads go in as they are, each key/value head serving its group of query heads (a copy of k and v per
    query head would be kept for the backward)."""
    return varlen_attn(
        q,
        k,
        v,
        cu_seq_lens,
        cu_seq_lens,
        max_length,
        max_length,
        scale=scale,
        window_size=(sliding_window - 1 if sliding_window else -1, 0) if causal else (-1, -1),
        **GROUPED_QUERY,
    )


# torch 2.13 and later take grouped-query heads when asked with enable_gqa (else they refuse them); torch 2.11's
# varlen_attn has no such argument and passes them through. Read once, not in every layer's call (torch.compile traces it).
GROUPED_QUERY = {"enable_gqa": True} if "enable_gqa" in inspect.signature(varlen_attn).parameters else {}

AttentionInterface.register(ATTENTION, varlen_attention)
# A vision tower's blocks hand their images' and windows' boundaries (cu_seqlens) to an implementation whose name holds
# "flash"; any other gets one SDPA call per window (7,232 calls per forward of 16 448x448 images in Qwen2.5-VL's tower).
VISION_ATTENTION = "oxrl_flash_varlen_vision"
AttentionInterface.register(VISION_ATTENTION, varlen_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, flash_attention_mask)  # no mask: the boundaries say it all
