"""Padding-free micro-batches: a micro-batch's sequences laid end to end in one row.

A right-padded micro-batch [B, T] spends every layer's work on its padding too; in RL,
where responses stop at different lengths, that is often a third of it. Packed, the
row holds only the real tokens, N = sum of the lengths; position ids restart at 0 for
each sequence, and attention stays inside each sequence through variable-length
attention over the sequences' boundaries (`cu_seq_lens`, as flash-attention names
them; `attention.py`).

The per-token outputs come back in the padded layout [B, T-1], so the losses never
see packing. A packed row's position that ends one sequence "predicts" the next
sequence's first token; that value is dropped when unpacking, so it gets no gradient.
"""

import torch


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
    """Right-padded input_ids and attention_mask [B, T] -> the model's packed inputs: input_ids and position_ids
    [1, N], and the boundaries the attention reads (cu_seq_lens [B+1] int32, max_length)."""
    lengths = attention_mask.sum(-1)  # [B]
    cu_seq_lens = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=input_ids.device)
    cu_seq_lens[1:] = lengths.cumsum(0)
    real = attention_mask.bool()  # [B, T]
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    max_length = int(lengths.max())
    return {
        "input_ids": input_ids[real][None],
        "position_ids": positions[real][None],
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": max_length,
        "max_length_k": max_length,
    }


def unpacking(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where `unpack` finds each value of the padded layout, from the micro-batch's attention_mask [B, T]: the packed
    row's index for each position [B, T-1] and whether that position predicts a token of its own sequence [B, T-1].
    Packed index i predicts token i+1; that is a token of the same sequence unless i is a sequence's last. Built once
    per micro-batch, on the CPU, for every output that is unpacked."""
    lengths = attention_mask.sum(-1, keepdim=True)  # [B, 1]
    t = torch.arange(attention_mask.shape[1] - 1, device=attention_mask.device)  # [T-1]
    index = (lengths.cumsum(0) - lengths + t).clamp_(max=max(int(lengths.sum()) - 2, 0))  # sequence start + t
    return index, t < lengths - 1  # right padding: position t < length-1 predicts


def unpack(packed: torch.Tensor, layout: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Prediction-aligned values of the packed row, [1, N-1, ...] -> the padded layout [B, T-1, ...], zero at
    padding, by the `unpacking` layout. A gather by index: nothing here waits for the GPU."""
    index, predicts = layout  # [B, T-1] each
    out = packed[0].index_select(0, index.flatten()).view(*index.shape, *packed.shape[2:])  # [B, T-1, ...]
    return out.masked_fill(~predicts.view(*index.shape, *[1] * (packed.dim() - 2)), 0)
