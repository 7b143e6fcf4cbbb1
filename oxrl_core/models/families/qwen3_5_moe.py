"""Qwen3.5 mixture of experts (Qwen3.5-35B-A3B): `Qwen3_5MoeForConditionalGeneration`, Qwen3.5's hybrid language
model (Gated DeltaNet layers and gated attention, `qwen3_5.py`) with every layer's MLP a router over experts plus a
shared expert that every token passes through, scaled by a gate of its own. Here 8 experts, 2 a token.

Packing and sampling on CPU as Qwen3.5's: DeltaNet layers run sequence by sequence in a packed row, and vLLM's CPU
engines run bfloat16. Its experts are fused in transformers, as Qwen3-MoE's (`qwen3_moe.py`).

Chat: Qwen3-VL's (ChatML with Qwen's vision markers).
"""

from dataclasses import replace
from pathlib import Path

from oxrl_core.models.families import qwen3_5


def build(folder: Path) -> None:
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    experts = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64)
    qwen3_5.save_hybrid(Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration, experts, folder)


# packed and sampled on CPU as Qwen3.5 (its DeltaNet layers per sequence, bf16 engines), with Qwen3.5's chat
FAMILY = replace(
    qwen3_5.FAMILY,
    model_types=("qwen3_5_moe", "qwen3_5_moe_text"),
    tiny_model="oxrl-tiny-qwen3-5-moe",
    build=build,
    router="Qwen3_5MoeTopKRouter",
)
