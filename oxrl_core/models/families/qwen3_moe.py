"""Qwen3 mixture of experts (Qwen3-30B-A3B): `Qwen3MoeForCausalLM`, Qwen3's attention (q/k norms, no bias) with
every layer's MLP a router over experts: each token goes to its `num_experts_per_tok` highest-scoring experts,
weighted by their softmax scores renormalised over the chosen ones (`norm_topk_prob`). Here 8 experts, 2 a token.

transformers holds a layer's experts fused (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]), its
checkpoints one matrix per expert; vLLM's loader takes both, so a refresh sends them as the trainer has them.

Chat: ChatML (`<|im_start|>role\\n` + content + `<|im_end|>\\n`), system allowed, `<|im_end|>` ends generation.
"""

from dataclasses import replace
from pathlib import Path

from oxrl_core.models.families import qwen3


def build(folder: Path) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    experts = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True)
    qwen3.save_qwen3(Qwen3MoeConfig, Qwen3MoeForCausalLM, experts | dict(tie_word_embeddings=False), folder)


FAMILY = replace(
    qwen3.FAMILY,
    model_types=("qwen3_moe",),
    tiny_model="oxrl-tiny-qwen3-moe",
    build=build,
    router="Qwen3MoeTopKRouter",
)
