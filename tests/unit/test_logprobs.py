"""Per-row float32 logprobs and entropies against a float64 full-vocabulary reference, values and gradients; the
Triton kernels too, on CPU through Triton's interpreter."""

import math
import os
import subprocess
import sys

import torch

from oxrl_core.algs.kl import token_kl
from oxrl_core.training import triton_logprobs
from oxrl_core.training.logprobs import token_logprobs, token_logprobs_and_entropy


def reference(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    log_p = torch.log_softmax(logits[:, :-1].double() / temperature, dim=-1)
    return log_p.gather(-1, ids[:, 1:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def test_logprobs_and_entropy_match_the_full_softmax_with_their_gradients():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 50, generator=g) * 3
    ids = torch.randint(0, 50, (3, 6), generator=g)
    weights_lp, weights_h = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    for temperature in (1.0, 0.7):
        mine = logits.clone().requires_grad_()
        lp, h = token_logprobs_and_entropy(mine, ids, temperature)
        ((lp * weights_lp).sum() + (h * weights_h).sum()).backward()
        ref = logits.double().requires_grad_()
        ref_lp, ref_h = reference(ref, ids, temperature)
        ((ref_lp * weights_lp.double()).sum() + (ref_h * weights_h.double()).sum()).backward()
        assert torch.allclose(lp.double(), ref_lp, atol=1e-5) and torch.allclose(h.double(), ref_h, atol=1e-5)
        assert torch.allclose(mine.grad.double(), ref.grad, atol=1e-5)
        assert (mine.grad[:, -1] == 0).all()  # the last position predicts nothing
        assert torch.equal(token_logprobs(logits, ids, temperature), lp.detach())


def test_an_entropy_reported_as_a_metric_leaves_the_logprob_gradient_alone():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 7, 40, generator=g) * 2
    ids = torch.randint(0, 40, (2, 7), generator=g)
    weights = torch.randn(2, 6, generator=g)
    for temperature in (1.0, 0.6):
        mine = logits.clone().requires_grad_()
        lp, h = token_logprobs_and_entropy(mine, ids, temperature)
        (lp * weights).sum().backward()  # the entropy gets no gradient
        ref = logits.double().requires_grad_()
        ref_lp, ref_h = reference(ref, ids, temperature)
        (ref_lp * weights.double()).sum().backward()
        assert torch.allclose(lp.double(), ref_lp, atol=1e-5) and torch.allclose(h.double(), ref_h, atol=1e-5)
        assert torch.allclose(mine.grad.double(), ref.grad, atol=1e-5)


def test_logprobs_and_entropy_gradients_pass_gradcheck_in_float64():
    g = torch.Generator().manual_seed(6)
    logits = (torch.randn(2, 4, 9, generator=g, dtype=torch.float64) * 2).requires_grad_()
    ids = torch.randint(0, 9, (2, 4), generator=g)
    assert torch.autograd.gradcheck(lambda x: token_logprobs_and_entropy(x, ids, 0.8), (logits,))


BLOCK = triton_logprobs.BLOCK
CHILD = """
import sys, torch
from oxrl_core.training.logprobs import token_logprobs, token_logprobs_and_entropy
cases = torch.load(sys.argv[1])
outputs = []
for case in cases:
    logits = case["logits"].clone().requires_grad_()
    if case["entropy"] is None:
        lp, h = token_logprobs(logits, case["ids"], case["temperature"]), None
        loss = (lp * case["weights"][0]).sum()
    else:
        lp, h = token_logprobs_and_entropy(logits, case["ids"], case["temperature"])
        loss = (lp * case["weights"][0]).sum() + (h * case["weights"][1]).sum() * (case["entropy"] == "grad")
    loss.backward()
    outputs.append({"logprobs": lp.detach(), "entropy": None if h is None else h.detach(), "grad": logits.grad})
torch.save(outputs, sys.argv[2])
"""


def interpreted(tmp_path, cases: list[dict]) -> list[dict]:
    """The CUDA path's Triton kernels run on CPU by Triton's interpreter, in a child process: TRITON_INTERPRET=1
    has to be set before triton is first imported (and it sends CPU tensors down the Triton path)."""
    torch.save(cases, tmp_path / "cases.pt")
    subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "cases.pt"), str(tmp_path / "out.pt")],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        check=True,
    )
    return torch.load(tmp_path / "out.pt")


def test_triton_kernels_match_the_full_softmax_across_vocabulary_blocks(tmp_path):
    g = torch.Generator().manual_seed(2)
    vocab = 2 * BLOCK + 37  # three blocks, the last partly outside the vocabulary
    logits = (torch.randn(2, 5, vocab, generator=g) * 4).to(torch.bfloat16)
    ids = torch.randint(0, vocab, (2, 5), generator=g)
    ids[0, 1], ids[1, 2] = vocab - 1, 2 * BLOCK  # targets in the last block
    logits[1, 3, 100] = 60.0  # a maximum that arrives in the first block and dominates
    logits[0, 0, vocab - 2] = 60.0  # and one that arrives only in the last block
    weights = torch.randn(2, 2, 4, generator=g)
    cases = [
        {"logits": logits, "ids": ids, "temperature": t, "entropy": entropy, "weights": weights}
        for t in (1.0, 0.7)
        for entropy in ("grad", "metric")
    ]
    for case, out in zip(cases, interpreted(tmp_path, cases)):
        ref = logits.double().requires_grad_()
        ref_lp, ref_h = reference(ref, ids, case["temperature"])
        (
            (ref_lp * weights[0].double()).sum() + (ref_h * weights[1].double()).sum() * (case["entropy"] == "grad")
        ).backward()
        assert torch.allclose(out["logprobs"].double(), ref_lp, atol=1e-5)
        assert torch.allclose(out["entropy"].double(), ref_h, atol=1e-4)
        assert out["grad"].dtype == torch.bfloat16 and (out["grad"][:, -1] == 0).all()
        # one bf16 unit in the last place: the interpreter truncates to bf16 where the GPU rounds
        assert torch.allclose(out["grad"].double(), ref.grad, rtol=2**-7, atol=1e-6)


def test_triton_forward_without_entropy_gives_the_same_logprobs(tmp_path):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 4, 300, generator=g)
    ids = torch.randint(0, 300, (3, 4), generator=g)
    case = {"logits": logits, "ids": ids, "temperature": 1.0, "weights": torch.ones(2, 3, 3)}
    with_h, without_h = interpreted(tmp_path, [case | {"entropy": "metric"}, case | {"entropy": None}])
    assert torch.equal(with_h["logprobs"], without_h["logprobs"]) and torch.equal(with_h["grad"], without_h["grad"])
    assert torch.allclose(without_h["logprobs"].double(), reference(logits.double(), ids, 1.0)[0], atol=1e-5)


def kl_reference(student: list, teacher: list, temperature: float) -> float:
    """KL(softmax(teacher / T) || softmax(student / T)) of one position, in plain float64 Python."""

    def log_softmax(row):
        top = max(v / temperature for v in row)
        lse = top + math.log(sum(math.exp(v / temperature - top) for v in row))
        return [v / temperature - lse for v in row]

    return sum(math.exp(lt) * (lt - ls) for lt, ls in zip(log_softmax(teacher), log_softmax(student)))


def test_token_kl_matches_the_softmax_kl_and_its_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(4)
    student = torch.randn(2, 4, 30, generator=g, dtype=torch.float64) * 3
    teacher = torch.randn(2, 4, 30, generator=g, dtype=torch.float64) * 3
    for temperature in (1.0, 0.5, 2.0):
        kl = token_kl(student, teacher, temperature)
        expected = [
            [kl_reference(student[b, n].tolist(), teacher[b, n].tolist(), temperature) for n in range(4)]
            for b in range(2)
        ]
        assert torch.allclose(kl, torch.tensor(expected, dtype=torch.float64), atol=1e-10)
        assert torch.autograd.gradcheck(
            lambda s: token_kl(s, teacher, temperature), (student.clone().requires_grad_(),)
        )


def test_token_kl_of_bfloat16_logits_runs_in_float32_and_gives_the_teacher_no_gradient():
    g = torch.Generator().manual_seed(5)
    student = (torch.randn(2, 3, 50, generator=g) * 4).to(torch.bfloat16).requires_grad_()
    teacher = (torch.randn(2, 3, 50, generator=g) * 4).to(torch.bfloat16).requires_grad_()
    kl = token_kl(student, teacher, 1.5)
    kl.sum().backward()
    expected = [[kl_reference(student[b, n].tolist(), teacher[b, n].tolist(), 1.5) for n in range(3)] for b in range(2)]
    assert kl.dtype == torch.float32 and torch.allclose(
        kl.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-5
    )
    assert student.grad.dtype == torch.bfloat16 and teacher.grad is None
