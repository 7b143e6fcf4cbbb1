"""Qwen3 mixture of experts (Qwen3-30B-A3B): `Qwen3MoeForCausalLM`, Qwen3's attention (q/k norms, no bias) with
every layer's MLP a router over experts: each token goes to its `num_experts_per_tok` highest-scoring experts,
weighted by their softmax scores renormalised over the chosen ones (`norm_topk_prob`). Here 8 experts, 2 a token.

transformers holds a layer's experts fused (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]), its
checkpoints one matrix per expert; vLLM's loader takes both, so a refresh sends them as the trainer has them.

Chat: ChatML (`<|im_start|>role\\n` + content + `<|im_end|>\\n`), system allowed, `<|im_end|>` ends generation.
"""

from pathlib import Path

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded
from oxrl_core.models.families.qwen2 import chatml_ids, chatml_tokenizer


def build(folder: Path) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = chatml_tokenizer()
    tokenizer.save_pretrained(folder)
    config = Qwen3MoeConfig(
        **TEXT_WIDTHS,
        **chatml_ids(tokenizer),
        vocab_size=len(tokenizer),
        head_dim=64,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        norm_topk_prob=True,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=False,
        dtype="float32",
    )
    save_seeded(Qwen3MoeForCausalLM, config, folder)


FAMILY = Family(
    model_types=("qwen3_moe",),
    tiny_model="oxrl-tiny-qwen3-moe",
    build=build,
    chat="ChatML; system allowed",
)
