"""The fused output layer + log-softmax (training/fused_head.py) against a float64 log-softmax of the full logits and
against the logits path it replaces: values and gradients (hidden states and weight), chunked every way; its Triton
path on CPU through Triton's interpreter; and the LogprobsHead that stands in for a model's output layer."""

import os
import subprocess
import sys

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from oxrl_core.training import fused_head, triton_logprobs
from oxrl_core.training.fused_head import LogprobsHead, fused_token_logprobs
from oxrl_core.training.logprobs import token_logprobs_and_entropy

B, T, H, V = 3, 7, 16, 50  # N = B (T-1) = 18 predicting positions


def inputs(seed: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [B, T, H], weight [V, H], input_ids [B, T], and per-token loss weights [2, B, T-1] (logprobs, entropy)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) * 0.7).to(dtype)
    ids = torch.randint(0, V, (B, T), generator=g)
    return hidden, weight, ids, torch.randn(2, B, T - 1, generator=g)


def reference(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, temperature: float):
    """The full logits' log-softmax in float64: logprobs of the next tokens and entropies, [B, T-1] each."""
    log_p = torch.log_softmax(hidden[:, :-1].double() @ weight.double().T / temperature, dim=-1)  # [B, T-1, V]
    return log_p.gather(-1, ids[:, 1:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def values_and_gradients(fn, hidden, weight, ids, weights, temperature):
    """fn's logprobs and entropy and the gradients of sum(w0 logprobs + w1 entropy) for hidden and weight."""
    hidden, weight = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logprobs, entropy = fn(hidden, weight, ids, temperature)
    ((logprobs * weights[0].to(logprobs.dtype)).sum() + (entropy * weights[1].to(entropy.dtype)).sum()).backward()
    return logprobs.detach(), entropy.detach(), hidden.grad, weight.grad


def fused(hidden, weight, ids, temperature):
    return fused_token_logprobs(hidden, weight, ids, temperature, with_entropy=True)


def logits_path(hidden, weight, ids, temperature):
    """What the engine did before: the logits [B, T, V], then their logprobs and entropies."""
    return token_logprobs_and_entropy(nn.functional.linear(hidden, weight), ids, temperature)


# CHUNK -> forward chunks of the 18 positions; backward slices of the 50 vocabulary entries
CHUNKINGS = {
    "one row, slices of 2": V,
    "4 rows (4+4+4+4+2), slices of 11 (11x4+6)": 4 * V + 3,
    "whole": fused_head.CHUNK,
}


@pytest.mark.parametrize("chunk", CHUNKINGS.values(), ids=CHUNKINGS.keys())
def test_logprobs_entropy_and_their_gradients_match_the_float64_log_softmax_of_the_full_logits(monkeypatch, chunk):
    monkeypatch.setattr(fused_head, "CHUNK", chunk)
    hidden, weight, ids, weights = inputs(0)
    ids[0, 1], ids[1, 3] = 0, V - 1  # targets in the first and the last slice
    for temperature in (1.0, 0.7):
        logprobs, entropy, grad_hidden, grad_weight = values_and_gradients(
            fused, hidden, weight, ids, weights, temperature
        )
        ref_hidden, ref_weight = hidden.double().requires_grad_(), weight.double().requires_grad_()
        ref_lp, ref_h = reference(ref_hidden, ref_weight, ids, temperature)
        ((ref_lp * weights[0].double()).sum() + (ref_h * weights[1].double()).sum()).backward()
        assert logprobs.dtype == entropy.dtype == torch.float32 and logprobs.shape == entropy.shape == (B, T - 1)
        torch.testing.assert_close(logprobs.double(), ref_lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(entropy.double(), ref_h, atol=1e-5, rtol=0)
        torch.testing.assert_close(grad_hidden.double(), ref_hidden.grad, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(grad_weight.double(), ref_weight.grad, atol=2e-5, rtol=1e-5)
        assert (grad_hidden[:, -1] == 0).all()  # the last position predicts nothing


@pytest.mark.parametrize("with_entropy", [True, False])
def test_gradients_pass_gradcheck_in_float64(monkeypatch, with_entropy):
    g = torch.Generator().manual_seed(1)
    hidden, weight = (
        torch.randn(2, 4, 4, generator=g, dtype=torch.float64),
        torch.randn(12, 4, generator=g, dtype=torch.float64),
    )
    ids = torch.randint(0, 12, (2, 4), generator=g)
    monkeypatch.setattr(
        fused_head, "CHUNK", 4 * 12 + 1
    )  # 6 positions in chunks of 4 + 2; 12 columns in slices of 8 + 4

    def fn(h, w):
        logprobs, entropy = fused_token_logprobs(h, w, ids, 0.8, with_entropy)
        return (logprobs, entropy) if with_entropy else logprobs

    assert torch.autograd.gradcheck(fn, (hidden.requires_grad_(), weight.requires_grad_()))


def test_equal_to_the_logits_path_within_1e_5_in_float32(monkeypatch):
    monkeypatch.setattr(fused_head, "CHUNK", 4 * V + 3)
    hidden, weight, ids, weights = inputs(2)
    for temperature in (1.0, 1.3):
        mine = values_and_gradients(fused, hidden, weight, ids, weights, temperature)
        before = values_and_gradients(logits_path, hidden, weight, ids, weights, temperature)
        for name, a, b in zip(("logprobs", "entropy", "grad_hidden", "grad_weight"), mine, before):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)


def test_bfloat16_inputs_give_the_logits_path_s_values_and_gradients_as_accurate(monkeypatch):
    g = torch.Generator().manual_seed(3)
    hidden, weight = (
        torch.randn(2, 33, 32, generator=g).bfloat16(),
        (torch.randn(600, 32, generator=g) * 0.3).bfloat16(),
    )
    ids, weights = torch.randint(0, 600, (2, 33), generator=g), torch.randn(2, 2, 32, generator=g)
    monkeypatch.setattr(fused_head, "CHUNK", 600 * 64 // 7)  # 64 positions in chunks of 9; slices of 85 columns
    mine = values_and_gradients(fused, hidden, weight, ids, weights, 0.7)
    before = values_and_gradients(logits_path, hidden, weight, ids, weights, 0.7)
    assert [t.dtype for t in mine] == [torch.float32, torch.float32, torch.bfloat16, torch.bfloat16]
    torch.testing.assert_close(mine[0], before[0], atol=1e-5, rtol=0)  # the same bf16 logits, the same values
    torch.testing.assert_close(mine[1], before[1], atol=1e-5, rtol=0)
    # The gradients are rounded differently (grad_hidden: a bf16 product per slice, summed in float32; the logits
    # path rounds one product), so each is held to the float64 gradient of the same bf16 inputs: no further from it.
    ref_hidden, ref_weight = hidden.double().requires_grad_(), weight.double().requires_grad_()
    ref_lp, ref_h = reference(ref_hidden, ref_weight, ids, 0.7)
    ((ref_lp * weights[0].double()).sum() + (ref_h * weights[1].double()).sum()).backward()
    for mine_grad, grad_before, ref in zip(mine[2:], before[2:], (ref_hidden.grad, ref_weight.grad)):
        assert (mine_grad.double() - ref).norm() <= 1.1 * (grad_before.double() - ref).norm()


def test_a_frozen_weight_gets_no_gradient_and_the_hidden_states_still_do():
    """LoRA: the output layer is frozen, and its gradient's products are skipped."""
    hidden, weight, ids, weights = inputs(4)
    hidden.requires_grad_()
    logprobs, entropy = fused_token_logprobs(hidden, weight, ids, 1.0, with_entropy=True)
    ((logprobs * weights[0]).sum() + (entropy * weights[1]).sum()).backward()
    expected = values_and_gradients(logits_path, hidden.detach(), weight, ids, weights, 1.0)[2]
    assert weight.grad is None
    torch.testing.assert_close(hidden.grad, expected, atol=1e-5, rtol=0)


CHILD = """
import sys, torch
from oxrl_core.training import fused_head
case = torch.load(sys.argv[1])
fused_head.CHUNK = case["chunk"]
hidden, weight = case["hidden"].clone().requires_grad_(), case["weight"].clone().requires_grad_()
logprobs, entropy = fused_head.fused_token_logprobs(hidden, weight, case["ids"], case["temperature"], with_entropy=True)
((logprobs * case["weights"][0]).sum() + (entropy * case["weights"][1]).sum()).backward()
torch.save({"logprobs": logprobs.detach(), "entropy": entropy.detach(), "grad_hidden": hidden.grad,
            "grad_weight": weight.grad}, sys.argv[2])
"""


def test_the_triton_path_matches_the_float64_log_softmax(tmp_path):
    """The kernels the fused head runs on CUDA, on CPU by Triton's interpreter in a child process (TRITON_INTERPRET=1
    must be set before triton is imported; it sends CPU tensors down the Triton path)."""
    g = torch.Generator().manual_seed(5)
    vocab = 2 * triton_logprobs.BLOCK + 37  # the forward's rows span three kernel blocks
    hidden, weight = torch.randn(2, 6, 8, generator=g), torch.randn(vocab, 8, generator=g)
    ids = torch.randint(0, vocab, (2, 6), generator=g)
    ids[0, 1], ids[1, 4] = 0, vocab - 1
    weights = torch.randn(2, 2, 5, generator=g)
    # 10 positions in chunks of 3 (3+3+3+1); the backward's vocabulary in slices of 2468 (3 x 2468 + 825)
    case = {"hidden": hidden, "weight": weight, "ids": ids, "temperature": 0.7, "weights": weights, "chunk": 3 * vocab}
    torch.save(case, tmp_path / "case.pt")
    subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "case.pt"), str(tmp_path / "out.pt")],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        check=True,
    )
    out = torch.load(tmp_path / "out.pt")
    ref_hidden, ref_weight = hidden.double().requires_grad_(), weight.double().requires_grad_()
    ref_lp, ref_h = reference(ref_hidden, ref_weight, ids, 0.7)
    ((ref_lp * weights[0].double()).sum() + (ref_h * weights[1].double()).sum()).backward()
    torch.testing.assert_close(out["logprobs"].double(), ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(out["entropy"].double(), ref_h, atol=1e-4, rtol=0)
    # float32 sums over 8229 vocabulary entries
    torch.testing.assert_close(out["grad_hidden"].double(), ref_hidden.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out["grad_weight"].double(), ref_weight.grad, atol=1e-4, rtol=1e-4)


def small_qwen(tied: bool) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_head_stands_in_for_the_output_layer_under_the_same_name_and_gives_its_logprobs(tied):
    model = small_qwen(tied)
    names = [name for name, _ in model.named_parameters()]
    weight = model.lm_head.weight
    head = LogprobsHead.replace_output_layer(model)
    assert model.lm_head is head and head.weight is weight and [n for n, _ in model.named_parameters()] == names
    assert (head.weight is model.model.embed_tokens.weight) == tied
    _, _, ids, weights = inputs(6)
    attention_mask = torch.ones_like(ids)

    def run(scored: bool):
        model.zero_grad()
        if scored:
            with head.scoring(ids, 0.7, with_entropy=True):
                logprobs, entropy = model(input_ids=ids, attention_mask=attention_mask).logits
        else:  # outside `scoring`: the logits, as the linear layer gave them
            logprobs, entropy = token_logprobs_and_entropy(
                model(input_ids=ids, attention_mask=attention_mask).logits, ids, 0.7
            )
        ((logprobs * weights[0]).sum() + (entropy * weights[1]).sum()).backward()
        return logprobs, entropy, {name: p.grad.clone() for name, p in model.named_parameters()}

    (lp, h, grads), (lp_before, h_before, grads_before) = run(scored=True), run(scored=False)
    torch.testing.assert_close(lp, lp_before, atol=1e-5, rtol=0)
    torch.testing.assert_close(h, h_before, atol=1e-5, rtol=0)
    for name in names:
        torch.testing.assert_close(grads[name], grads_before[name], atol=1e-5, rtol=1e-5, msg=name)
    assert head._scoring is None  # closed again


def test_an_output_layer_with_a_lora_adapter_or_a_bias_keeps_its_logits():
    lora = get_peft_model(small_qwen(tied=False), LoraConfig(r=2, target_modules=["q_proj", "lm_head"]))
    assert LogprobsHead.replace_output_layer(lora.get_base_model()) is None
    assert type(lora.get_base_model().lm_head).__name__ == "Linear"  # peft's, left in place
    biased = small_qwen(tied=False)
    biased.lm_head = nn.Linear(32, V, bias=True)
    assert LogprobsHead.replace_output_layer(biased) is None and type(biased.lm_head) is nn.Linear
