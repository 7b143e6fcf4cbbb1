"""The LoRA weight refresh: what the trainer sends vLLM is the merged weight as a plain tensor."""

import torch
from peft import LoraConfig, get_peft_model
from torch.multiprocessing.reductions import reduce_tensor
from transformers import AutoModelForCausalLM

from oxrl_core.training.publish import merged_lora_weight

R, ALPHA = 8, 16.0


def test_merged_lora_weight_is_w_plus_scaled_ba_without_autograd_history_so_it_can_be_shared(tiny_model_dir):
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
        LoraConfig(r=R, lora_alpha=ALPHA, target_modules=["q_proj"]),
    )
    layer = model.get_submodule("base_model.model.model.layers.0.self_attn.q_proj")
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_(std=0.05)  # peft starts B at zero: no delta to see
    assert layer.lora_A["default"].weight.requires_grad  # in training, as in the trainer

    merged = merged_lora_weight(layer.base_layer.weight, layer)

    assert merged.grad_fn is None and not merged.requires_grad
    # The colocated GPU refresh sends weights as CUDA IPC handles made by reduce_tensor, which refuses a tensor with
    # autograd history whatever its device ("Cowardly refusing to serialize non-leaf tensor which requires_grad").
    rebuild, args = reduce_tensor(merged)
    shared = rebuild(*args)
    w = layer.base_layer.weight.double()  # [out, in]
    a, b = layer.lora_A["default"].weight.double(), layer.lora_B["default"].weight.double()  # [r, in], [out, r]
    expected = [
        [
            w[i, j].item() + ALPHA / R * sum(b[i, k].item() * a[k, j].item() for k in range(R))
            for j in range(0, w.shape[1], 17)
        ]
        for i in range(0, w.shape[0], 13)
    ]
    assert torch.allclose(shared[::13, ::17].double(), torch.tensor(expected, dtype=torch.float64), atol=1e-6)
