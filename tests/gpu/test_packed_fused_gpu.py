"""On a GPU: packed micro-batches (torch's varlen_attn) and the fused output layer (its Triton kernels) give the padded
logits path's logprobs, entropies and gradients, on a model of Qwen2.5-0.5B's width with grouped-query attention."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from oxrl_core.training.fused_head import LogprobsHead
from oxrl_core.training.logprobs import token_logprobs_and_entropy
from oxrl_core.training.packing import ATTENTION, pack, unpack, unpacking

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LENGTHS = [300, 17, 640, 1, 128]


def model(attention: str, dtype: torch.dtype) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=151936, hidden_size=896, num_hidden_layers=2, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True)
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
    got_logprobs, got_entropy = unpack(packed_logprobs, unpacking(attention_mask)), unpack(packed_entropy, unpacking(attention_mask))
    ((got_logprobs + got_entropy) * weights).sum().backward()

    assert (got_logprobs - logprobs * real).abs().max() <= tolerance
    assert (got_entropy - entropy * real).abs().max() <= tolerance
    for (name, a), b in zip(padded_model.named_parameters(), packed_model.parameters()):
        scale = a.grad.abs().max().item()
        assert (b.grad - a.grad).abs().max().item() <= tolerance * max(scale, 1e-3), name
