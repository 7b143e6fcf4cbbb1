"""Building a rank's models: the policy (LoRA, compiled blocks, fused logprobs head) and the frozen models beside it."""

import inspect
import re

import torch

from oxrl_core.models.families import Family, family_of
from oxrl_core.models.hub import media_encoder
from oxrl_core.models.tokenizer import load_tokenizer
from oxrl_core.training.attention import ATTENTION as PACKED_ATTENTION
from oxrl_core.training.attention import VISION_ATTENTION
from oxrl_core.training.deepspeed_setup import model_dtype
from oxrl_core.training.fused_head import LogprobsHead
from oxrl_core.training.spec import TrainerSpec
from oxrl_core.training.zero3 import gather_by_block, repeated_blocks, rope_in_float32, torch_linear


def load_options(spec: TrainerSpec, packed: bool, family: Family | None) -> dict:
    """`from_pretrained`'s arguments for every model of the run: its dtype, its attention (packed rows: the
    variable-length kernel; `varlen` otherwise means sdpa; the one its family's trainer must use) and whether remote
    code may run."""
    attention = PACKED_ATTENTION if packed else spec.model.attn_implementation.replace("varlen", "sdpa")
    if family and family.trainer_attention:
        attention = family.trainer_attention
    return dict(
        dtype=model_dtype(spec.model), attn_implementation=attention, trust_remote_code=spec.model.trust_remote_code
    )


def pretrained(path: str, multimodal: bool, load: dict) -> torch.nn.Module:
    """The language model at `path`: a multimodal one reads images or audio beside the tokens."""
    from transformers import AutoModelForCausalLM, AutoModelForMultimodalLM

    model = (AutoModelForMultimodalLM if multimodal else AutoModelForCausalLM).from_pretrained(path, **load)
    family = family_of(model.config.model_type)
    if load["attn_implementation"] == PACKED_ATTENTION and family and family.prepare_packed:
        family.prepare_packed(model)
    return model


def pretrained_policy(model_path: str, multimodal: bool, reward_model: bool, load: dict) -> torch.nn.Module:
    """The policy as loaded; a reward model as a sequence classifier with one label, told the pad id that ends each
    sequence (it pools at the last non-pad token)."""
    if not reward_model:
        return pretrained(model_path, multimodal, load)
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(
        model_path, num_labels=1, pad_token_id=load_tokenizer(model_path)[1], **load
    )


def trainable_policy(
    model: torch.nn.Module, spec: TrainerSpec, multimodal: bool, zero3: bool, reward_model: bool, on_gpu: bool
) -> tuple[torch.nn.Module, LogprobsHead | None]:
    """The loaded policy made ready for DeepSpeed, and its LogprobsHead (or None): its media encoder set up, ZeRO-3's
    patches, gradient checkpointing, LoRA's adapters, compiled blocks."""
    if multimodal:
        set_up_media_encoder(media_encoder(model), spec.model.freeze_vision)
    if zero3:
        rope_in_float32(model)
        torch_linear()
    if spec.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if spec.lora.enabled:
        model = with_lora(model, spec, zero3, reward_model, multimodal)
    causal_lm = model.get_base_model() if spec.lora.enabled else model  # the Hugging Face model, adapters in it
    if compiles_layers(spec, on_gpu):
        compile_blocks(causal_lm, multimodal, zero3)
    if zero3:
        gather_by_block(causal_lm)
    # The policy's logprobs come from its output layer without logits [B, T, V] (fused_head.py); in place before
    # DeepSpeed wraps the model, so that its ZeRO-3 hooks gather the weight around the fused op.
    return model, LogprobsHead.replace_output_layer(causal_lm)


def set_up_media_encoder(tower: torch.nn.Module, freeze: bool) -> None:
    """Vision towers whose blocks attend within boundaries (Qwen2-VL, Qwen2.5-VL, Qwen3-VL: `cu_seqlens`): all images'
    (and windows') patches in one variable-length attention call per block; frozen with `model.freeze_vision`."""
    if any("cu_seqlens" in inspect.signature(m.forward).parameters for m in tower.modules()):
        tower.config._attn_implementation = VISION_ATTENTION
    if freeze:
        tower.requires_grad_(False)


def with_lora(
    model: torch.nn.Module, spec: TrainerSpec, zero3: bool, reward_model: bool, multimodal: bool
) -> torch.nn.Module:
    """The model with LoRA adapters (a PeftModel) in its language model; only they take a gradient."""
    from peft import LoraConfig, get_peft_model

    # Frozen embeddings would cut the checkpointed graph, and ZeRO-3 gathers a leaf block's weights for its
    # backward only when the block's input takes a gradient (gather_by_block)
    if spec.model.gradient_checkpointing or zero3:
        model.enable_input_require_grads()
    lora = spec.lora
    # SEQ_CLS also trains (and saves) the reward model's new scalar head in full
    return get_peft_model(
        model,
        LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules,
            # the media encoder's layers may share the language model's names (Qwen2.5-VL's vision MLP has gate_proj,
            # up_proj and down_proj): adapters there would train a tower that is frozen and never refreshed
            exclude_modules=_encoder_modules(model) if multimodal else None,
            task_type="SEQ_CLS" if reward_model else "CAUSAL_LM",
        ),
    )


def _encoder_modules(model: torch.nn.Module) -> str:
    """A regex of the media encoder's module names, as peft matches `exclude_modules`."""
    tower = media_encoder(model)
    name = next(name for name, module in model.named_modules() if module is tower)
    return rf"{re.escape(name)}(\..*)?"


def frozen_model(path: str, multimodal: bool, load: dict, zero3: bool, ds_config: dict, device: torch.device) -> tuple:
    """A model that only runs forwards, and its LogprobsHead (or None); under ZeRO-3 sharded like the policy."""
    model = pretrained(path, multimodal, load).eval()
    model.requires_grad_(False)
    head = LogprobsHead.replace_output_layer(model)
    if zero3:
        import deepspeed

        rope_in_float32(model)
        torch_linear()
        gather_by_block(model)
        model = deepspeed.initialize(model=model, config=ds_config)[0]
    return model.to(device), head


def compiles_layers(spec: TrainerSpec, on_gpu: bool) -> bool:
    """`model.compile`; `auto` where it was measured to pay: on GPUs, ZeRO-3 included (one graph per pass once
    torch's linear is back in place, `torch_linear`: the train pass 1.2x faster than eager on 2 H200s,
    benchmarks/RESULTS.md, "Two GPUs")."""
    if spec.model.compile == "auto":
        return on_gpu
    return spec.model.compile


def compile_blocks(model: torch.nn.Module, multimodal: bool = False, zero3: bool = False) -> None:
    """Regional compilation: torch.compile (inductor) each of the model's repeated blocks, the decoder layers its
    `_no_split_modules` names. They share one compiled code (torch >= 2.5 does not specialise it on the module
    instance), so a first step compiles one layer, not the whole model; a model naming no block is compiled whole.
    A vision tower's blocks stay eager: their attention splits the patches per image and window at lengths read to the
    host (`.tolist()`), which the compiler unrolls and specialises on, recompiling for every batch of images.
    Under ZeRO-3 only each block's `forward` is compiled: compiling its whole call would trace DeepSpeed's gather and
    release hooks, which read each module's and parameter's `ds_id`, and the compiler, guarding on those numbers,
    recompiled for every layer until its limit of 8 and ran the other layers eager (slower than all eager)."""
    eager = {id(m) for m in media_encoder(model).modules()} if multimodal else set()
    for block in [m for m in repeated_blocks(model) if id(m) not in eager] or [model]:
        if zero3:
            block.forward = torch.compile(block.forward)
        else:
            block.compile()
