"""Preference, distillation and reward-model losses against independent float64 references in plain Python."""

import math
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch

from oxrl_core.algs.dpo import dpo_loss
from oxrl_core.algs.ipo import ipo_loss
from oxrl_core.algs.kd import kd_loss
from oxrl_core.algs.kl import token_kl
from oxrl_core.algs.kto import kto_loss
from oxrl_core.algs.orpo import orpo_loss
from oxrl_core.algs.rm import rm_loss
from oxrl_core.algs.simpo import simpo_loss

TOL = 1e-6
LENGTH_KEYS = ("chosen_lengths", "rejected_lengths", "lengths", "response_mask")  # zero here = padding filler


# ---------------------------------------------------------------- plain-Python references (lists of floats, math)


def log_sigmoid(x):
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def sigmoid(x):
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def valid_pairs(x):
    return [i for i in range(len(x["chosen_lengths"])) if x["chosen_lengths"][i] > 0 and x["rejected_lengths"][i] > 0]


def reward_metrics(rewards):
    """The four reward sums and the pair count from [(reward_chosen, reward_rejected), ...] of valid pairs."""
    return {
        "reward_chosen_sum": sum(c for c, _ in rewards),
        "reward_rejected_sum": sum(r for _, r in rewards),
        "reward_correct_sum": float(sum(c > r for c, r in rewards)),
        "reward_margin_sum": sum(c - r for c, r in rewards),
        "pairs": float(len(rewards)),
    }


def ref_dpo(x, *, beta, label_smoothing, num_pairs):
    loss, rewards = 0.0, []
    for i in valid_pairs(x):
        rc = beta * (x["chosen_logps"][i] - x["ref_chosen_logps"][i])
        rr = beta * (x["rejected_logps"][i] - x["ref_rejected_logps"][i])
        loss += -(1 - label_smoothing) * log_sigmoid(rc - rr) - label_smoothing * log_sigmoid(rr - rc)
        rewards.append((rc, rr))
    return loss / num_pairs, reward_metrics(rewards)


def ref_ipo(x, *, beta, num_pairs):
    loss, rewards = 0.0, []
    for i in valid_pairs(x):
        ratio_c = x["chosen_logps"][i] - x["ref_chosen_logps"][i]
        ratio_r = x["rejected_logps"][i] - x["ref_rejected_logps"][i]
        loss += (ratio_c - ratio_r - 1 / (2 * beta)) ** 2
        rewards.append((beta * ratio_c, beta * ratio_r))
    return loss / num_pairs, reward_metrics(rewards)


def ref_simpo(x, *, beta, gamma, num_pairs):
    loss, rewards = 0.0, []
    for i in valid_pairs(x):
        rc = beta * x["chosen_logps"][i] / x["chosen_lengths"][i]
        rr = beta * x["rejected_logps"][i] / x["rejected_lengths"][i]
        loss += -log_sigmoid(rc - rr - gamma)
        rewards.append((rc, rr))
    return loss / num_pairs, reward_metrics(rewards)


def ref_orpo(x, *, lam, num_pairs, num_chosen_tokens):
    nll = odds_ratio = log_odds_ratio_sum = 0.0
    rewards = []
    for i in valid_pairs(x):
        mc = x["chosen_logps"][i] / x["chosen_lengths"][i]
        mr = x["rejected_logps"][i] / x["rejected_lengths"][i]
        log_odds_c = math.log(math.exp(mc) / (1 - math.exp(mc)))
        log_odds_r = mr - math.log(1 - math.exp(mr))  # the same, written so that it survives exp(mr) underflowing
        nll += -x["chosen_logps"][i]
        odds_ratio += -log_sigmoid(log_odds_c - log_odds_r)
        log_odds_ratio_sum += log_odds_c - log_odds_r
        rewards.append((lam * mc, lam * mr))
    metrics = reward_metrics(rewards) | {"nll_sum": nll, "log_odds_ratio_sum": log_odds_ratio_sum}
    return nll / num_chosen_tokens + lam * odds_ratio / num_pairs, metrics


def ref_rm(x, *, num_pairs):
    loss, rewards = 0.0, []
    for i in valid_pairs(x):
        sc, sr = x["chosen_scores"][i], x["rejected_scores"][i]
        loss += -log_sigmoid(sc - sr - x["margin"][i])
        rewards.append((sc, sr))
    return loss / num_pairs, reward_metrics(rewards)


def ref_kto(x, *, kl_baseline, beta, desirable_weight, undesirable_weight, num_examples):
    z = kl_baseline if kl_baseline > 0 else 0.0
    loss = 0.0
    metrics = {"reward_desirable_sum": 0.0, "desirable": 0.0, "reward_undesirable_sum": 0.0, "undesirable": 0.0}
    for i in range(len(x["lengths"])):
        if x["lengths"][i] == 0:
            continue
        ratio = x["logps"][i] - x["ref_logps"][i]
        if x["desirable"][i] == 1.0:
            loss += desirable_weight * (1 - sigmoid(beta * (ratio - z)))
            metrics["reward_desirable_sum"] += beta * ratio
            metrics["desirable"] += 1
        else:
            loss += undesirable_weight * (1 - sigmoid(beta * (z - ratio)))
            metrics["reward_undesirable_sum"] += beta * ratio
            metrics["undesirable"] += 1
    return loss / num_examples, metrics


def log_softmax_list(row):
    top = max(row)
    lse = top + math.log(sum(math.exp(v - top) for v in row))
    return [v - lse for v in row]


def ref_kd(x, *, alpha, temperature, num_tokens):
    nll = kl = tokens = 0.0
    for b, mask_row in enumerate(x["response_mask"]):
        for t, m in enumerate(mask_row):
            if not m:
                continue
            student = log_softmax_list([v / temperature for v in x["student_logits"][b][t]])
            teacher = log_softmax_list([v / temperature for v in x["teacher_logits"][b][t]])
            kl += sum(math.exp(lt) * (lt - ls) for lt, ls in zip(teacher, student))
            nll += -x["logprobs"][b][t]
            tokens += 1
    loss = (alpha * nll + (1 - alpha) * temperature**2 * kl) / num_tokens
    return loss, {"nll_sum": nll, "kl_sum": kl, "tokens": tokens}


# ---------------------------------------------------------------- batches


def f64(*values):
    return torch.tensor(values, dtype=torch.float64)


def pair_batch(seed, n=5):
    g = torch.Generator().manual_seed(seed)

    def uniform():  # [n] in [0, 1)
        return torch.rand(n, generator=g, dtype=torch.float64)

    chosen_lengths = torch.randint(1, 40, (n,), generator=g).double()
    rejected_lengths = torch.randint(1, 40, (n,), generator=g).double()
    chosen_lengths[seed % n] = rejected_lengths[seed % n] = 0  # padding filler
    rejected_lengths[(seed + 2) % n] = 0  # a half-empty pair is dropped too
    chosen = -chosen_lengths * (0.05 + 3 * uniform())  # mean token logprob in (-3.05, -0.05]
    rejected = -rejected_lengths * (0.05 + 3 * uniform())
    return {
        "chosen_logps": chosen,
        "rejected_logps": rejected,
        "ref_chosen_logps": chosen + 8 * (uniform() - 0.5),
        "ref_rejected_logps": rejected + 8 * (uniform() - 0.5),
        "chosen_lengths": chosen_lengths,
        "rejected_lengths": rejected_lengths,
        "chosen_scores": 3 * torch.randn(n, generator=g, dtype=torch.float64),
        "rejected_scores": 3 * torch.randn(n, generator=g, dtype=torch.float64),
        "margin": uniform(),
    }


def long_pair_batch():
    """Responses of thousands of tokens: sums near -5000 and margins where a naive log(sigmoid) overflows."""
    return {
        "chosen_logps": f64(-5000, -5000, -4000),
        "rejected_logps": f64(-3000, -0.5, -6000),
        "ref_chosen_logps": f64(-4000, -4500, -4200),
        "ref_rejected_logps": f64(-4000, -0.25, -5000),
        "chosen_lengths": f64(4000, 10, 3500),
        "rejected_lengths": f64(3800, 4096, 4000),
        "chosen_scores": f64(-500, 300, 2),
        "rejected_scores": f64(500, -300, 1),
        "margin": f64(0, 1, 0.5),
    }


def kto_batch(seed, n=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (n,), generator=g).double()
    lengths[seed % n] = 0
    logps = -lengths * (0.05 + 3 * torch.rand(n, generator=g, dtype=torch.float64))
    desirable = (torch.rand(n, generator=g) > 0.5).double()
    desirable[:2] = torch.tensor([1.0, 0.0])  # both kinds present
    return {
        "logps": logps,
        "ref_logps": logps + 20 * (torch.rand(n, generator=g, dtype=torch.float64) - 0.5),
        "lengths": lengths,
        "desirable": desirable,
    }


def long_kto_batch():
    return {
        "logps": f64(-5000, -5000, -3000, -4000),
        "ref_logps": f64(-4000, -6000, -4000, -2000),
        "lengths": f64(4000, 4000, 3000, 3900),
        "desirable": f64(1, 1, 0, 0),
    }


def kd_batch(seed, n=4, T=5, V=7):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, T, generator=g) > 0.3).double()
    mask[seed % n] = 0  # padding filler
    return {
        "student_logits": 2 * torch.randn(n, T, V, generator=g, dtype=torch.float64),
        "teacher_logits": 2 * torch.randn(n, T, V, generator=g, dtype=torch.float64),
        "logprobs": -3 * torch.rand(n, T, generator=g, dtype=torch.float64),
        "response_mask": mask,
    }


def long_kd_batch():
    """Logits in the hundreds: only a max-shifted softmax stays finite."""
    batch = kd_batch(7, n=2, T=3, V=5)
    batch["student_logits"] *= 200
    batch["teacher_logits"] *= 200
    batch["response_mask"][:] = 1
    return batch


# ---------------------------------------------------------------- the cases every generic test runs on


def pair_counts(x):
    return {"num_pairs": float(len(valid_pairs(x)))}


class Case(NamedTuple):
    batch: Callable  # (seed, n rows) -> inputs
    long_batch: Callable  # -> inputs with very long responses (or extreme logits)
    grad_keys: tuple  # inputs that carry a gradient
    norms: Callable  # inputs as lists -> the global normalisers the caller would pass
    loss: Callable  # (tensors, norms) -> (loss, metrics)
    reference: Callable  # (lists, norms) -> (loss, metrics)


def pick(x, *keys):
    return [x[k] for k in keys]


REF_FREE_IN = ("chosen_logps", "rejected_logps", "chosen_lengths", "rejected_lengths")
DPO_IN = (*REF_FREE_IN[:2], "ref_chosen_logps", "ref_rejected_logps", *REF_FREE_IN[2:])
KTO_IN = ("logps", "ref_logps", "lengths", "desirable")
RM_IN = ("chosen_scores", "rejected_scores", "margin", "chosen_lengths", "rejected_lengths")
KTO_KW = dict(kl_baseline=0.3, beta=0.1, desirable_weight=1.0, undesirable_weight=1.33)
KD_KW = dict(alpha=0.3, temperature=2.0)

CASES = {
    "dpo": Case(
        pair_batch,
        long_pair_batch,
        ("chosen_logps", "rejected_logps"),
        pair_counts,
        lambda t, n: dpo_loss(*pick(t, *DPO_IN), beta=0.1, label_smoothing=0.1, **n),
        lambda x, n: ref_dpo(x, beta=0.1, label_smoothing=0.1, **n),
    ),
    "ipo": Case(
        pair_batch,
        long_pair_batch,
        ("chosen_logps", "rejected_logps"),
        pair_counts,
        lambda t, n: ipo_loss(*pick(t, *DPO_IN), beta=0.1, **n),
        lambda x, n: ref_ipo(x, beta=0.1, **n),
    ),
    "simpo": Case(
        pair_batch,
        long_pair_batch,
        ("chosen_logps", "rejected_logps"),
        pair_counts,
        lambda t, n: simpo_loss(*pick(t, *REF_FREE_IN), beta=2.0, gamma=1.0, **n),
        lambda x, n: ref_simpo(x, beta=2.0, gamma=1.0, **n),
    ),
    "orpo": Case(
        pair_batch,
        long_pair_batch,
        ("chosen_logps", "rejected_logps"),
        lambda x: pair_counts(x) | {"num_chosen_tokens": sum(x["chosen_lengths"][i] for i in valid_pairs(x))},
        lambda t, n: orpo_loss(*pick(t, *REF_FREE_IN), lam=0.1, **n),
        lambda x, n: ref_orpo(x, lam=0.1, **n),
    ),
    "rm": Case(
        pair_batch,
        long_pair_batch,
        ("chosen_scores", "rejected_scores"),
        pair_counts,
        lambda t, n: rm_loss(*pick(t, *RM_IN), **n),
        lambda x, n: ref_rm(x, **n),
    ),
    "kto": Case(
        kto_batch,
        long_kto_batch,
        ("logps",),
        lambda x: {"num_examples": float(sum(1 for v in x["lengths"] if v > 0))},
        lambda t, n: kto_loss(*pick(t, *KTO_IN), **KTO_KW, **n),
        lambda x, n: ref_kto(x, **KTO_KW, **n),
    ),
    "kd": Case(
        kd_batch,
        long_kd_batch,
        ("student_logits", "logprobs"),
        lambda x: {"num_tokens": float(sum(map(sum, x["response_mask"])))},
        lambda t, n: kd_from_logits(t, **KD_KW, **n),
        lambda x, n: ref_kd(x, **KD_KW, **n),
    ),
}


def kd_from_logits(x, **kw):
    """KD as the trainer computes it: the per-token KL row by row (`token_kl`), then `kd_loss`."""
    kl = token_kl(x["student_logits"], x["teacher_logits"], kw["temperature"])
    return kd_loss(kl, x["logprobs"], x["response_mask"], **kw)


def as_lists(inputs):
    return {k: v.tolist() for k, v in inputs.items()}


def run(case, inputs, norms=None, dtype=torch.float64):
    """The loss on `inputs` cast to `dtype`, backpropagated; returns (loss, metrics, grads by key, the cast inputs)."""
    tensors = {k: v.detach().to(dtype).requires_grad_(k in case.grad_keys) for k, v in inputs.items()}
    loss, metrics = case.loss(tensors, norms or case.norms(as_lists(inputs)))
    loss.backward()
    return loss, metrics, {k: tensors[k].grad for k in case.grad_keys}, tensors


def assert_close(got_loss, got_metrics, want_loss, want_metrics, tol=TOL, rel=0.0):
    assert abs(got_loss - want_loss) <= tol + rel * abs(want_loss)
    assert set(got_metrics) == set(want_metrics)
    for k, want in want_metrics.items():
        assert abs(got_metrics[k] - want) <= tol + rel * abs(want), k
        assert got_metrics[k].dim() == 0 and not got_metrics[k].requires_grad, (
            k
        )  # a detached scalar, read by the engine


# ---------------------------------------------------------------- generic tests, every loss


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("name", CASES)
def test_loss_and_metrics_match_the_reference_on_random_inputs(name, seed):
    case = CASES[name]
    inputs = case.batch(seed)
    loss, metrics, _, _ = run(case, inputs)
    lists = as_lists(inputs)
    assert_close(loss.item(), metrics, *case.reference(lists, case.norms(lists)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", CASES)
def test_very_long_responses_stay_finite_and_match_the_reference(name, dtype):
    case = CASES[name]
    inputs = case.long_batch()
    loss, metrics, grads, cast = run(case, inputs, dtype=dtype)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads.values())
    lists = as_lists({k: v.double() for k, v in cast.items()})  # the reference sees the values the loss saw
    tol, rel = (TOL, 0.0) if dtype == torch.float64 else (1e-4, 1e-5)
    assert_close(loss.item(), metrics, *case.reference(lists, case.norms(lists)), tol=tol, rel=rel)


@pytest.mark.parametrize("filler", ["zeros", "leftover values"])
@pytest.mark.parametrize("name", CASES)
def test_fully_masked_rows_contribute_nothing(name, filler):
    case = CASES[name]
    inputs = case.batch(0, 8)
    rows = [1, 5]  # besides the filler the batch has already
    for k, v in inputs.items():
        if filler == "zeros" or k in LENGTH_KEYS:
            v[rows] = 0
    keep = [i for i in range(len(next(iter(inputs.values())))) if i not in rows]
    norms = case.norms(as_lists(inputs))
    loss, metrics, grads, _ = run(case, inputs, norms)
    kept_loss, kept_metrics, _, _ = run(case, {k: v[keep] for k, v in inputs.items()}, norms)
    assert_close(loss.item(), metrics, kept_loss.item(), kept_metrics, tol=1e-12)
    for g in grads.values():
        assert torch.isfinite(g).all()
        assert (g[rows] == 0).all()


@pytest.mark.parametrize("name", CASES)
def test_micro_batch_losses_and_metrics_add_up_to_the_whole_batch(name):
    case = CASES[name]
    inputs = case.batch(1)
    norms = case.norms(as_lists(inputs))
    loss, metrics, _, _ = run(case, inputs, norms)
    first, first_metrics, _, _ = run(case, {k: v[:2] for k, v in inputs.items()}, norms)
    second, second_metrics, _, _ = run(case, {k: v[2:] for k, v in inputs.items()}, norms)
    summed = {k: first_metrics[k] + second_metrics[k] for k in metrics}
    assert_close(loss.item(), metrics, (first + second).item(), summed, tol=1e-12)


@pytest.mark.parametrize("name", ["dpo", "ipo", "simpo", "orpo", "rm", "kto"])
def test_sequence_losses_work_in_the_input_dtype(name):
    case = CASES[name]
    loss, _, grads, _ = run(case, case.batch(2), dtype=torch.bfloat16)
    assert loss.dtype == torch.bfloat16 and torch.isfinite(loss)
    assert all(g.dtype == torch.bfloat16 and torch.isfinite(g).all() for g in grads.values())


# ---------------------------------------------------------------- chosen identical to rejected


def identical_pairs(n=4):
    logps = -torch.arange(1.0, n + 1, dtype=torch.float64) * 7
    lengths = torch.arange(1.0, n + 1, dtype=torch.float64) * 5
    return logps, lengths


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_dpo_on_identical_responses_is_log_2_per_pair_and_no_pair_correct(label_smoothing):
    logps, lengths = identical_pairs()
    ref = logps - 3
    loss, m = dpo_loss(logps, logps, ref, ref, lengths, lengths, beta=0.5, label_smoothing=label_smoothing, num_pairs=4)
    assert abs(loss.item() - math.log(2)) <= TOL
    assert m["reward_correct_sum"] == 0 and m["reward_margin_sum"] == 0 and m["pairs"] == 4
    assert abs(m["reward_chosen_sum"] - 4 * 0.5 * 3) <= TOL


def test_ipo_on_identical_responses_is_the_squared_target():
    logps, lengths = identical_pairs()
    loss, m = ipo_loss(logps, logps, logps + 1, logps + 1, lengths, lengths, beta=0.25, num_pairs=4)
    assert abs(loss.item() - (1 / (2 * 0.25)) ** 2) <= TOL
    assert m["reward_correct_sum"] == 0 and m["reward_margin_sum"] == 0


def test_simpo_on_identical_responses_pays_the_whole_margin():
    logps, lengths = identical_pairs()
    loss, m = simpo_loss(logps, logps, lengths, lengths, beta=2.0, gamma=1.5, num_pairs=4)
    assert abs(loss.item() - math.log1p(math.exp(1.5))) <= TOL
    assert m["reward_correct_sum"] == 0


def test_orpo_on_identical_responses_is_the_nll_plus_lam_log_2():
    logps, lengths = identical_pairs()
    loss, m = orpo_loss(logps, logps, lengths, lengths, lam=0.5, num_pairs=4, num_chosen_tokens=lengths.sum().item())
    nll = -logps.sum().item() / lengths.sum().item()
    assert abs(loss.item() - (nll + 0.5 * math.log(2))) <= TOL
    assert m["reward_correct_sum"] == 0 and m["log_odds_ratio_sum"] == 0


def test_rm_on_equal_scores_is_log_2_and_a_margin_raises_it():
    scores, lengths = identical_pairs()
    loss, m = rm_loss(scores, scores, torch.zeros(4, dtype=torch.float64), lengths, lengths, num_pairs=4)
    assert abs(loss.item() - math.log(2)) <= TOL and m["reward_correct_sum"] == 0
    with_margin, _ = rm_loss(scores, scores, torch.ones(4, dtype=torch.float64), lengths, lengths, num_pairs=4)
    assert abs(with_margin.item() - math.log1p(math.e)) <= TOL


# ---------------------------------------------------------------- gradients that prove the direction of learning


def one_pair(chosen, rejected, ref_chosen=0.0, ref_rejected=0.0, length=10.0):
    def t(v, grad=False):
        return torch.tensor([v], dtype=torch.float64, requires_grad=grad)

    return t(chosen, True), t(rejected, True), t(ref_chosen), t(ref_rejected), t(length), t(length)


def test_dpo_gradient_raises_chosen_and_lowers_rejected():
    c, r, rc, rr, lc, lr = one_pair(-20.0, -18.0, -19.0, -19.0)
    dpo_loss(c, r, rc, rr, lc, lr, beta=0.1, label_smoothing=0.0, num_pairs=1)[0].backward()
    assert c.grad.item() < 0 < r.grad.item()


def test_dpo_label_smoothing_pulls_back_an_overconfident_margin():
    beta, ls = 0.1, 0.2
    for smoothing, pushes_chosen_up in [(0.0, True), (ls, False)]:
        c, r, rc, rr, lc, lr = one_pair(-10.0, -60.0, -20.0, -20.0)  # beta * h = 5: far past cDPO's optimum
        dpo_loss(c, r, rc, rr, lc, lr, beta=beta, label_smoothing=smoothing, num_pairs=1)[0].backward()
        x = beta * 50.0
        expected = beta * (-(1 - smoothing) * sigmoid(-x) + smoothing * sigmoid(x))
        assert abs(c.grad.item() - expected) <= TOL and abs(r.grad.item() + expected) <= TOL
        assert (c.grad.item() < 0) == pushes_chosen_up


@pytest.mark.parametrize("h, direction", [(2.0, -1), (5.0, 0), (9.0, 1)])  # target 1 / (2 * 0.1) = 5
def test_ipo_pulls_the_margin_to_its_target_from_both_sides(h, direction):
    c, r, rc, rr, lc, lr = one_pair(-10.0 + h, -10.0, -10.0, -10.0)
    ipo_loss(c, r, rc, rr, lc, lr, beta=0.1, num_pairs=1)[0].backward()
    assert abs(c.grad.item() - 2 * (h - 5.0)) <= TOL  # d/dc (h - 5)^2
    assert (c.grad.item() > 0) - (c.grad.item() < 0) == direction


def test_simpo_gradient_per_logprob_shrinks_with_response_length():
    c = torch.tensor([-10.0, -100.0], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([-10.0, -100.0], dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([10.0, 100.0], dtype=torch.float64)  # same mean logprob, 10x the tokens
    simpo_loss(c, r, lengths, lengths, beta=2.0, gamma=1.0, num_pairs=2)[0].backward()
    assert (c.grad < 0).all() and (r.grad > 0).all()
    assert abs(c.grad[0].item() / c.grad[1].item() - 10.0) <= TOL


def test_orpo_gradient_raises_chosen_and_lowers_rejected():
    c, r, _, _, lc, lr = one_pair(-8.0, -6.0)
    orpo_loss(c, r, lc, lr, lam=0.5, num_pairs=1, num_chosen_tokens=10.0)[0].backward()
    assert c.grad.item() < 0 < r.grad.item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_orpo_stays_finite_when_a_response_is_certain(dtype):
    c = torch.tensor([0.0, -1e-30], dtype=dtype, requires_grad=True)  # P = 1 in rounding, and nearly
    r = torch.tensor([-5.0, 0.0], dtype=dtype, requires_grad=True)
    lengths = torch.tensor([10.0, 10.0], dtype=dtype)
    loss, m = orpo_loss(c, r, lengths, lengths, lam=0.5, num_pairs=2, num_chosen_tokens=20.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(c.grad).all() and torch.isfinite(r.grad).all()
    assert all(math.isfinite(v) for v in m.values())


def test_rm_gradient_raises_chosen_and_lowers_rejected_scores():
    sc, sr, _, _, lc, lr = one_pair(0.5, 1.0)
    rm_loss(sc, sr, torch.tensor([0.0], dtype=torch.float64), lc, lr, num_pairs=1)[0].backward()
    assert abs(sc.grad.item() + sigmoid(0.5)) <= TOL and abs(sr.grad.item() - sigmoid(0.5)) <= TOL


def test_kto_pushes_desirable_examples_up_and_undesirable_down():
    logps = torch.tensor([-10.0, -10.0, -12.0, -12.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-11.0, -9.0, -11.0, -13.0], dtype=torch.float64)
    desirable = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    kto_loss(logps, ref, torch.full((4,), 5.0, dtype=torch.float64), desirable, **KTO_KW, num_examples=4)[0].backward()
    assert (logps.grad[:2] < 0).all() and (logps.grad[2:] > 0).all()


def test_kto_treats_a_negative_kl_baseline_as_zero():
    inputs = kto_batch(4)

    def loss_at(kl_baseline):
        return kto_loss(*pick(inputs, *KTO_IN), **KTO_KW | {"kl_baseline": kl_baseline}, num_examples=5.0)[0].item()

    assert loss_at(-3.0) == loss_at(0.0)
    assert loss_at(0.5) != loss_at(0.0)
    lists = as_lists(inputs)
    assert abs(loss_at(-3.0) - ref_kto(lists, **KTO_KW | {"kl_baseline": 0.0}, num_examples=5.0)[0]) <= TOL


def test_kd_gradient_vanishes_when_the_student_already_matches_the_teacher():
    inputs = kd_batch(5)
    student = inputs["teacher_logits"].clone().requires_grad_(True)
    teacher = inputs["teacher_logits"].clone().requires_grad_(True)
    logprobs = inputs["logprobs"].clone().requires_grad_(True)
    loss, m = kd_from_logits(
        {
            "student_logits": student,
            "teacher_logits": teacher,
            "logprobs": logprobs,
            "response_mask": inputs["response_mask"],
        },
        alpha=0.0,
        temperature=2.0,
        num_tokens=10.0,
    )
    loss.backward()
    assert abs(loss.item()) <= 1e-12 and abs(m["kl_sum"]) <= 1e-12
    assert student.grad.abs().max().item() <= 1e-12 and logprobs.grad.abs().max().item() == 0
    assert teacher.grad is None  # the teacher is a fixed target


def test_kd_with_alpha_1_is_the_data_nll_and_ignores_the_logits():
    inputs = kd_batch(6)
    student = inputs["student_logits"].clone().requires_grad_(True)
    loss, m = kd_from_logits(inputs | {"student_logits": student}, alpha=1.0, temperature=3.0, num_tokens=9.0)
    loss.backward()
    assert abs(loss.item() - m["nll_sum"] / 9.0) <= 1e-12
    assert student.grad.abs().max().item() == 0


def test_kd_upcasts_half_precision_logits():
    inputs = kd_batch(8)
    half = {k: v.to(torch.bfloat16) if k.endswith("logits") else v.float() for k, v in inputs.items()}
    loss, _ = kd_from_logits(half, **KD_KW, num_tokens=10.0)
    assert loss.dtype == torch.float32
    lists = as_lists({k: v.double() for k, v in half.items()})
    assert abs(loss.item() - ref_kd(lists, **KD_KW, num_tokens=10.0)[0]) <= 1e-5
