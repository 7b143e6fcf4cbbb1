"""Qwen3.5 dense (Qwen3.5-27B): `Qwen3_5ForConditionalGeneration`, natively image-text-to-text. Its language model
interleaves Gated DeltaNet layers (linear attention: a causal convolution, then a recurrent state updated by the
delta rule with a learned decay, per head) with gated full-attention layers (partial rotary, q/k norms, an output
gate), three to one in the real models (here one of each); the vision tower is Qwen3-VL's without deepstack.

Packing (a text-only Qwen3.5; multimodal models run padded): the DeltaNet layers carry a state along the row, so
packed sequences would leak into each other unless each sequence's boundaries reach the convolution and the
recurrence. transformers' torch kernels (the CPU's) ignore the boundaries, and `causal-conv1d`'s (the GPU's) takes
none, so packed, each DeltaNet layer runs sequence by sequence (`run_deltanet_per_sequence`).
Sampling on CPU: vLLM's CPU DeltaNet kernel takes bfloat16 only, so the engines run bf16 there while the trainer
runs float32; the sampler-trainer gap is then bf16's, 1e-3 a token at these widths (docs/guides/models.md).

Chat: Qwen3-VL's (ChatML with Qwen's vision markers).
"""

from functools import partial
from pathlib import Path

import torch

from oxrl_core.models.families.base import TEXT_WIDTHS, Family, save_seeded
from oxrl_core.models.families.qwen2 import chatml_ids
from oxrl_core.models.families.qwen2_vl import vision_tokenizer
from oxrl_core.models.families.qwen3_vl import VISION, save_processor


def build(folder: Path) -> None:
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    save_hybrid(Qwen3_5Config, Qwen3_5ForConditionalGeneration, {}, folder)


def save_hybrid(config_class, model_class, text_widths: dict, folder: Path) -> None:
    """A tiny Qwen3.5 of `config_class` and `model_class` (dense, or with the experts of `text_widths`): one DeltaNet
    layer and one attention layer, Qwen3-VL's vision tower without deepstack, its tokenizer and processor."""
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer, media_ids = vision_tokenizer()
    config = config_class(
        text_config=dict(
            **TEXT_WIDTHS,
            **chatml_ids(tokenizer),
            vocab_size=len(tokenizer),
            head_dim=64,
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=64,  # vLLM's CPU DeltaNet kernel takes 64 or more
            linear_value_head_dim=64,
            linear_conv_kernel_dim=4,
            rms_norm_eps=1e-6,
            # a quarter of each 64-wide head rotates: 8 frequencies interleaved over (time, height, width)
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e7,
                "partial_rotary_factor": 0.25,
                "mrope_section": [3, 3, 2],
                "mrope_interleaved": True,
            },
            tie_word_embeddings=False,
            **text_widths,
        ),
        vision_config={key: value for key, value in VISION.items() if key != "deepstack_visual_indexes"},
        **media_ids,
        tie_word_embeddings=False,
        dtype="float32",
    )
    save_seeded(model_class, config, folder)
    save_processor(Qwen3VLProcessor, Qwen3VLVideoProcessor, tokenizer, folder)


def run_deltanet_per_sequence(model: torch.nn.Module) -> None:
    """Make each Gated DeltaNet layer of `model` run a packed row's sequences one by one, at the boundaries the row
    carries (`cu_seq_lens_q`), so that no state crosses from one sequence into the next; attention layers and
    unpacked calls are unchanged."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet

    for layer in model.modules():
        if isinstance(layer, (Qwen3_5GatedDeltaNet, Qwen3_5MoeGatedDeltaNet)):
            layer.forward = partial(_each_sequence, layer.forward)


def _each_sequence(forward, hidden_states: torch.Tensor, cache_params=None, attention_mask=None, **kwargs):
    bounds = kwargs.get("cu_seq_lens_q")  # [B+1] of a packed row [1, N, H], which no later call continues: no cache
    if bounds is None:
        return forward(hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
    ends = bounds.tolist()
    return torch.cat([forward(hidden_states[:, start:end]) for start, end in zip(ends[:-1], ends[1:])], dim=1)


FAMILY = Family(
    model_types=("qwen3_5", "qwen3_5_text"),
    tiny_model="oxrl-tiny-qwen3-5",
    build=build,
    chat="ChatML; an image part renders `<|vision_start|><|image_pad|><|vision_end|>`",
    prepare_packed=run_deltanet_per_sequence,
    cpu_sampler_dtype="bfloat16",
)
