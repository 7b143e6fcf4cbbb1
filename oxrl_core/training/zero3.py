"""What ZeRO-3 needs beyond DeepSpeed's defaults: its gathers by block, and two of its side effects undone."""

import torch


def gather_by_block(model: torch.nn.Module) -> None:
    """ZeRO-3: each repeated block one leaf module, its weights gathered and released once per call instead of around
    each of its linear layers: the hooks of a 0.5B model's 290 tensors per micro-batch become 24 of its layers'
    (host time per micro-batch: benchmarks/probes/host_overhead.py, variants zero3 and zero3+leaf)."""
    from deepspeed.utils import set_z3_leaf_modules

    blocks = repeated_blocks(model)
    if blocks:
        set_z3_leaf_modules(model, sorted({type(b) for b in blocks}, key=lambda t: t.__name__))


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the modules of the classes its `_no_split_modules` names (decoder layers, vision
    blocks)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def rope_in_float32(model: torch.nn.Module) -> None:
    """Rebuild each rotary embedding's buffers in float32. ZeRO-3 builds a model partitioned (zero.Init), which makes
    every floating tensor created in a module's __init__ bf16, RoPE's inverse frequencies too: made there and never
    loaded from a checkpoint, they come out up to 0.6% off (Qwen2.5's: angles off by up to 0.74 rad at position 639).
    Transformers' rotary modules take their config alone; rebuilt here, outside zero.Init, they compute in float32.
    Known upstream since 2024 (deepspeedai/DeepSpeed#4932, huggingface/transformers#28596), still so in DeepSpeed 0.19."""
    for module in model.modules():
        if isinstance(getattr(module, "inv_freq", None), torch.Tensor) and hasattr(module, "config"):
            fresh = type(module)(module.config)
            for name, buffer in fresh.named_buffers(recurse=False):
                setattr(module, name, buffer.to(module.inv_freq.device))


def torch_linear() -> None:
    """Give `torch.nn.functional.linear` back to torch. DeepSpeed's zero.Init, which builds a ZeRO-3 model, replaces it
    for the whole process with an autograd function whose backward gathers a weight still partitioned then (it reads the
    weight's `ds_id`). oxrl gathers each repeated block's weights for its backward anyway (gather_by_block), and other
    modules' by DeepSpeed's hooks. With that function, the compiler of torch 2.11 guarded on each weight's `ds_id` in
    every compiled layer and recompiled for each layer until its limit of 8, the rest eager (benchmarks/RESULTS.md,
    "Two GPUs")."""
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as zero_init

    torch.nn.functional.linear = getattr(zero_init, "linear_bk", torch.nn.functional.linear)
