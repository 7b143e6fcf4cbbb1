"""On a GPU: packed micro-batches (torch's varlen_attn) and the fused output layer (its Triton kernels) give the padded
logits path's logprobs, entropies and gradients, on a model of Qwen2.5-0.5B's width with grouped-query attention; a
vision tower's flash varlen attention gives its per-window SDPA values."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from oxrl_core.training.attention import ATTENTION
from oxrl_core.training.fused_head import LogprobsHead
from oxrl_core.training.logprobs import token_logprobs_and_entropy
from oxrl_core.training.packing import pack, unpack, unpacking

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LENGTHS = [300, 17, 640, 1, 128]


def model(attention: str, dtype: torch.dtype) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        num_hidden_layers=2,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM._from_config(config, attn_implementation=attention, dtype=dtype).cuda()


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 0.1)], ids=["float32", "bf16"])
def test_packed_and_fused_equal_the_padded_logits_path_on_the_gpu(dtype, tolerance):
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for b, n in enumerate(LENGTHS):
        input_ids[b, :n] = torch.randint(0, 151936, (n,), generator=generator)
        attention_mask[b, :n] = 1
    input_ids, attention_mask = input_ids.cuda(), attention_mask.cuda()
    real = attention_mask[:, 1:].float()
    weights = torch.randn(real.shape, generator=generator).cuda() * real

    padded_model = model("sdpa", dtype)
    logits = padded_model(input_ids=input_ids, attention_mask=attention_mask).logits
    logprobs, entropy = token_logprobs_and_entropy(logits, input_ids, 0.7)
    ((logprobs + entropy) * weights).sum().backward()

    packed_model = model(ATTENTION, dtype)
    head = LogprobsHead.replace_output_layer(packed_model)
    inputs = pack(input_ids, attention_mask)
    with head.scoring(inputs["input_ids"], 0.7, True):
        packed_logprobs, packed_entropy = packed_model(**inputs).logits
    got_logprobs, got_entropy = (
        unpack(packed_logprobs, unpacking(attention_mask)),
        unpack(packed_entropy, unpacking(attention_mask)),
    )
    ((got_logprobs + got_entropy) * weights).sum().backward()

    assert (got_logprobs - logprobs * real).abs().max() <= tolerance
    assert (got_entropy - entropy * real).abs().max() <= tolerance
    for (name, a), b in zip(padded_model.named_parameters(), packed_model.parameters()):
        scale = a.grad.abs().max().item()
        assert (b.grad - a.grad).abs().max().item() <= tolerance * max(scale, 1e-3), name


def test_a_vision_towers_flash_varlen_attention_equals_its_per_window_sdpa_on_the_gpu():
    """Qwen2.5-VL's tower at its real width, 2 blocks (one windowed, one full), two 448x448 images in bf16: the one
    flash call per block over all windows gives the per-window SDPA calls' output, and a trained tower's gradients."""
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from oxrl_core.training.attention import VISION_ATTENTION

    config = Qwen2_5_VLConfig(
        vision_config=dict(
            depth=2,
            hidden_size=1280,
            intermediate_size=3420,
            num_heads=16,
            out_hidden_size=2048,
            hidden_act="silu",
            window_size=112,
            fullatt_block_indexes=[1],
        )
    ).vision_config
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(config, dtype=torch.bfloat16).cuda()
    grid = torch.tensor([[1, 32, 32]] * 2).cuda()
    pixels = torch.randn(2048, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(0)).cuda().bfloat16()
    outputs, grads = [], []
    for attention in ("sdpa", VISION_ATTENTION):
        tower.config._attn_implementation = attention
        tower.zero_grad()
        out = tower(pixels, grid_thw=grid).pooler_output
        out.float().square().mean().backward()
        outputs.append(out.float())
        grads.append(tower.blocks[0].attn.qkv.weight.grad.float())
    print("vision varlen vs per-window sdpa: max |output diff|", (outputs[0] - outputs[1]).abs().max().item())
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0.05, atol=0.05)
    torch.testing.assert_close(grads[1], grads[0], rtol=0.05, atol=0.05 * grads[0].abs().max().item())
