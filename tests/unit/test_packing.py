"""Padding-free packing (training/packing.py): a packed micro-batch gives the padded one's per-token values and
gradients, and packing's bookkeeping (positions, boundaries, unpacking) is exact."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from oxrl_core.training.attention import ATTENTION
from oxrl_core.training.logprobs import token_logprobs
from oxrl_core.training.packing import pack, unpack, unpacking

LENGTHS = [5, 9, 1, 7]  # a one-token sequence too: it predicts nothing


def padded_batch(lengths: list[int], vocab: int = 50, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for b, n in enumerate(lengths):
        input_ids[b, :n] = torch.randint(1, vocab, (n,), generator=generator)
        attention_mask[b, :n] = 1
    return input_ids, attention_mask


def test_pack_lays_the_sequences_end_to_end_with_positions_from_zero_and_their_boundaries():
    input_ids, attention_mask = padded_batch(LENGTHS)
    packed = pack(input_ids, attention_mask)
    assert packed["input_ids"].tolist() == [sum((input_ids[b, :n].tolist() for b, n in enumerate(LENGTHS)), [])]
    assert packed["position_ids"].tolist() == [[t for n in LENGTHS for t in range(n)]]
    assert packed["cu_seq_lens_q"].tolist() == [0, 5, 14, 15, 22] and packed["max_length_q"] == 9


def test_unpack_puts_each_prediction_back_and_drops_the_ones_across_a_boundary():
    _, attention_mask = padded_batch(LENGTHS)
    n = sum(LENGTHS)
    values = torch.arange(1.0, n)[None]  # [1, N-1]: packed index i holds i + 1
    out = unpack(values, unpacking(attention_mask))  # [B, T-1]
    starts = [0, 5, 14, 15]
    for b, (start, length) in enumerate(zip(starts, LENGTHS)):
        assert out[b, : length - 1].tolist() == [start + t + 1.0 for t in range(length - 1)]
        assert (out[b, length - 1 :] == 0).all()  # padding, and nothing from the next sequence


def test_unpack_keeps_trailing_dimensions():
    _, attention_mask = padded_batch([3, 2])
    out = unpack(torch.ones(1, 4, 6), unpacking(attention_mask))
    assert out.shape == (2, 2, 6) and out[0].sum() == 12 and out[1, 0].sum() == 6 and out[1, 1].sum() == 0


@pytest.fixture(scope="module")
def models():
    """The same small Qwen2 (grouped-query attention: 4 query heads, 2 key/value heads) with padded SDPA attention
    and with the packed attention."""

    def config() -> Qwen2Config:  # one each: a model keeps its attention choice in its config
        return Qwen2Config(
            vocab_size=50,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )

    torch.manual_seed(0)
    padded = Qwen2ForCausalLM._from_config(config(), attn_implementation="sdpa", dtype=torch.float32)
    packed = Qwen2ForCausalLM._from_config(config(), attn_implementation=ATTENTION, dtype=torch.float32)
    packed.load_state_dict(padded.state_dict())
    return padded, packed


def test_a_packed_micro_batch_has_the_padded_one_s_logprobs_and_gradients(models):
    padded_model, packed_model = models
    input_ids, attention_mask = padded_batch(LENGTHS)
    weights = torch.randn(len(LENGTHS), max(LENGTHS) - 1)  # an arbitrary loss over the real positions
    mask = attention_mask[:, 1:].float()

    reference = token_logprobs(padded_model(input_ids=input_ids, attention_mask=attention_mask).logits, input_ids)
    (reference * weights * mask).sum().backward()
    inputs = pack(input_ids, attention_mask)
    got = unpack(token_logprobs(packed_model(**inputs).logits, inputs["input_ids"]), unpacking(attention_mask))
    (got * weights * mask).sum().backward()

    torch.testing.assert_close(got * mask, reference * mask, atol=1e-5, rtol=0)
    for (name, a), b in zip(padded_model.named_parameters(), packed_model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_packed_attention_does_not_look_across_sequences(models):
    """Changing the first sequence must leave the second one's logits as they were."""
    _, packed_model = models
    input_ids, attention_mask = padded_batch([4, 6])
    changed = input_ids.clone()
    changed[0, :4] = (changed[0, :4] + 1) % 50
    with torch.no_grad():
        before, after = (packed_model(**pack(ids, attention_mask)).logits[0, 4:] for ids in (input_ids, changed))
    torch.testing.assert_close(after, before)


def test_flash_attention_is_given_grouped_query_heads_in_a_form_this_torch_accepts():
    """Query heads 14, key/value heads 2 (Qwen2.5-0.5B's) reach flash attention's kernel past torch's own checks: torch
    2.13 refuses them unless asked with enable_gqa. The CPU has no flash kernel, so reaching it ends in aten's
    NotImplementedError; the GPU lane runs the kernel itself (tests/gpu/test_packed_fused_gpu.py)."""
    from oxrl_core.training.attention import flash_varlen_attention

    q, kv = torch.randn(10, 14, 64, dtype=torch.bfloat16), torch.randn(10, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="_flash_attention_forward"):
        flash_varlen_attention(q, kv, kv, torch.tensor([0, 4, 10], dtype=torch.int32), 6, None)


def test_a_packed_sliding_window_layer_sees_only_its_window_as_the_padded_one_does():
    """Gemma 3's layer mix (a sliding-window layer of 3 tokens, then a global one): packed, each query of the local
    layer attends to itself and the 2 tokens before it in its own sequence, as transformers' padded mask has it."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    def config() -> Gemma3TextConfig:
        return Gemma3TextConfig(
            vocab_size=50,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            intermediate_size=64,
            max_position_embeddings=64,
            sliding_window=3,
            layer_types=["sliding_attention", "full_attention"],
        )

    torch.manual_seed(0)
    padded = Gemma3ForCausalLM._from_config(config(), attn_implementation="sdpa", dtype=torch.float32)
    packed = Gemma3ForCausalLM._from_config(config(), attn_implementation=ATTENTION, dtype=torch.float32)
    packed.load_state_dict(padded.state_dict())
    input_ids, attention_mask = padded_batch(LENGTHS)
    mask = attention_mask[:, 1:].float()
    with torch.no_grad():
        reference = token_logprobs(padded(input_ids=input_ids, attention_mask=attention_mask).logits, input_ids)
        inputs = pack(input_ids, attention_mask)
        got = unpack(token_logprobs(packed(**inputs).logits, inputs["input_ids"]), unpacking(attention_mask))
        wide = Gemma3ForCausalLM._from_config(config(), attn_implementation=ATTENTION, dtype=torch.float32)
        wide.config.sliding_window = wide.model.layers[0].self_attn.sliding_window = 64
        wide.load_state_dict(padded.state_dict())
        unwindowed = unpack(token_logprobs(wide(**inputs).logits, inputs["input_ids"]), unpacking(attention_mask))
    torch.testing.assert_close(got * mask, reference * mask, atol=1e-5, rtol=0)
    assert ((unwindowed - reference) * mask).abs().max() > 1e-3  # the window masks something here
