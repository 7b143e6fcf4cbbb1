"""The RL losses TRL 1.16 implements equal TRL's own code on the same float64 tensors: its `_compute_loss` for each
`loss_type` (GRPO, DAPO, Dr. GRPO, SGRPO's token mean as `bnpo`), `importance_sampling_level="sequence"` (GSPO),
RLOO's trainer, and the block of `_generate_and_score_completions` that computes its vLLM importance-sampling
correction for each of its four modes (read from TRL's source, run as written)."""

import inspect
import math
import textwrap
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.rloo_trainer import RLOOTrainer

from oxrl_core.algs.correction import importance_weights
from oxrl_core.algs.dapo import dapo_loss
from oxrl_core.algs.grpo import grpo_loss
from oxrl_core.algs.gspo import gspo_loss
from oxrl_core.algs.rloo import rloo_loss
from oxrl_core.algs.sgrpo import sgrpo_loss

B, T = 6, 7


def tensors(seed: int, spread: float = 0.3):
    """logp, old, ref [B, T], advantages [B] and a response mask with a row of no tokens, float64."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = (old + spread * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    ref = old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.25).double()
    mask[2] = 0.0
    return logp, old, ref, adv, mask


def fake_trainer(logp: torch.Tensor, **settings) -> SimpleNamespace:
    """What TRL's `_compute_loss` reads of its trainer: one process, one micro-batch, the model's logprobs given."""
    accelerator = SimpleNamespace(
        num_processes=1,
        sync_gradients=True,
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction: x,
    )
    defaults = dict(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logp, torch.zeros_like(logp), None),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=0.0,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        epsilon_low=0.2,
        epsilon_high=0.2,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=T,
        accelerator=accelerator,
        _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list)},
    )
    return SimpleNamespace(**(defaults | settings))


def trl_grpo(logp, old, adv, mask, ref=None, is_ratio=None, **settings) -> torch.Tensor:
    inputs = dict(
        prompt_ids=torch.zeros(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.long),
        completion_ids=torch.zeros(B, T, dtype=torch.long),
        completion_mask=mask,
        advantages=adv,
        old_per_token_logps=old,
        num_items_in_batch=mask.sum(),
        ref_per_token_logps=ref,
    )
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
        settings |= dict(use_vllm=True, vllm_importance_sampling_correction=True)
    return GRPOTrainer._compute_loss(fake_trainer(logp, **settings), None, inputs)


def same_loss_and_gradient(ours: torch.Tensor, theirs: torch.Tensor, logp: torch.Tensor) -> None:
    (ours_grad,) = torch.autograd.grad(ours, logp)
    (theirs_grad,) = torch.autograd.grad(theirs, logp)
    assert math.isclose(ours.item(), theirs.item(), rel_tol=1e-12, abs_tol=1e-12), (ours.item(), theirs.item())
    assert torch.allclose(ours_grad, theirs_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_is_trls_grpo_loss(seed, beta):
    logp, old, ref, adv, mask = tensors(seed)
    ours, _ = grpo_loss(
        logp, old, adv, mask, torch.ones_like(mask), ref if beta else None, clip_low=0.2, kl_coeff=beta, num_seqs=B
    )
    same_loss_and_gradient(ours, trl_grpo(logp, old, adv, mask, ref, loss_type="grpo", beta=beta), logp)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dapo_is_trls_dapo_loss_with_clip_higher(seed):
    logp, old, _, adv, mask = tensors(seed)
    ours, _ = dapo_loss(
        logp, old, adv, mask, torch.ones_like(mask), clip_low=0.2, clip_high=0.28, num_tokens=mask.sum().item()
    )
    same_loss_and_gradient(ours, trl_grpo(logp, old, adv, mask, loss_type="dapo", epsilon_high=0.28), logp)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_dr_grpo_is_trls_dr_grpo_loss(seed, beta):
    """Dr. GRPO is SGRPO with its preset: the token sum over the constant max length, the symmetric clip."""
    logp, old, ref, adv, mask = tensors(seed)
    ours, _ = sgrpo_loss(
        logp,
        old,
        adv,
        mask,
        torch.ones_like(mask),
        ref if beta else None,
        clip_low=0.2,
        clip_high=0.2,
        kl_coeff=beta,
        loss_agg="seq-mean-token-sum-norm",
        num_tokens=mask.sum().item(),
        num_seqs=B,
        max_tokens=T,
    )
    same_loss_and_gradient(ours, trl_grpo(logp, old, adv, mask, ref, loss_type="dr_grpo", beta=beta), logp)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sgrpo_token_mean_is_trls_bnpo_loss(seed):
    logp, old, _, adv, mask = tensors(seed)
    ours, _ = sgrpo_loss(
        logp,
        old,
        adv,
        mask,
        torch.ones_like(mask),
        None,
        clip_low=0.2,
        clip_high=0.28,
        kl_coeff=0.0,
        loss_agg="token-mean",
        num_tokens=mask.sum().item(),
        num_seqs=B,
        max_tokens=T,
    )
    same_loss_and_gradient(ours, trl_grpo(logp, old, adv, mask, loss_type="bnpo", epsilon_high=0.28), logp)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_is_trls_sequence_level_importance_sampling(seed):
    """Spread small enough that some sequence ratios fall inside GSPO's narrow clip and some outside."""
    logp, old, _, adv, mask = tensors(seed, spread=2e-3)
    ours, metrics = gspo_loss(
        logp, old, adv, mask, torch.ones_like(mask), clip_low=3e-4, clip_high=4e-4, num_seqs=B, token_gradients=False
    )
    theirs = trl_grpo(
        logp,
        old,
        adv,
        mask,
        loss_type="grpo",
        importance_sampling_level="sequence",
        epsilon_low=3e-4,
        epsilon_high=4e-4,
    )
    same_loss_and_gradient(ours, theirs, logp)
    assert 0 < metrics["clip_frac_sum"] < mask.sum()


def test_gspo_token_has_gspos_value_and_with_equal_weights_its_gradient():
    logp, old, _, adv, mask = tensors(3, spread=1e-3)
    kw = dict(clip_low=3e-4, clip_high=4e-4, num_seqs=B)
    sequence, _ = gspo_loss(logp, old, adv, mask, torch.ones_like(mask), token_gradients=False, **kw)
    token, _ = gspo_loss(logp, old, adv, mask, torch.ones_like(mask), token_gradients=True, **kw)
    same_loss_and_gradient(token, sequence, logp)


def trl_correction(old, sampler, mask, mode: str, cap: float, floor: float | None) -> torch.Tensor:
    """TRL 1.16's vLLM importance-sampling block, taken from `_generate_and_score_completions` and run as written."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    start = source.index(
        "            if self.use_vllm and self.vllm_importance_sampling_correction:\n                mask = "
    )
    end = source.index("            # Compute the per-token log probabilities for the reference model", start)
    block = textwrap.dedent(source[start:end])
    trainer = SimpleNamespace(
        use_vllm=True,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_max=cap,
        vllm_importance_sampling_clip_min=floor,
    )
    scope = dict(
        self=trainer,
        completion_mask=mask,
        tool_mask=None,
        old_per_token_logps=old,
        sampling_per_token_logps=sampler,
        torch=torch,
        math=math,
    )
    exec(block, scope)
    return scope["vllm_importance_sampling_ratio"]


@pytest.mark.parametrize("mode", ["token-truncate", "token-mask", "sequence-truncate", "sequence-mask"])
@pytest.mark.parametrize("floor", [None, 0.5])
def test_the_sampler_trainer_correction_is_trls_in_each_mode_and_so_is_the_corrected_loss(mode, floor):
    logp, old, _, adv, mask = tensors(4)
    g = torch.Generator().manual_seed(9)
    sampler = old + 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)  # a gap wide enough to cross the cap
    theirs = trl_correction(old, sampler, mask, mode.replace("-", "_"), 2.0, floor)  # [B, T] or [B, 1]
    ours, stats = importance_weights(old, sampler, mask, mode, cap=2.0, floor=floor or 0.0)
    on = mask > 0
    assert torch.allclose(ours[on], theirs.expand(B, T)[on], rtol=1e-12, atol=0)
    assert torch.all(ours[~on] == 1.0)
    assert 0 < stats["is_corrected_tokens"] < on.sum()
    # the gap it logs in every mode, from the definitions token by token: |log q - log p| and KL(q || p) by k3
    pairs = [(old[i, t].item(), sampler[i, t].item()) for i in range(B) for t in range(T) if mask[i, t] > 0]
    assert stats["tokens"] == len(pairs)
    assert stats["gap_abs_sum"] == pytest.approx(sum(abs(q - p) for p, q in pairs), rel=1e-12)
    assert stats["gap_kl_sum"] == pytest.approx(sum(math.exp(p - q) - (p - q) - 1 for p, q in pairs), rel=1e-12)
    loss, _ = sgrpo_loss(
        logp,
        old,
        adv,
        mask,
        ours,
        None,
        clip_low=0.2,
        clip_high=0.28,
        kl_coeff=0.0,
        loss_agg="token-mean",
        num_tokens=mask.sum().item(),
        num_seqs=B,
        max_tokens=T,
    )
    same_loss_and_gradient(
        loss, trl_grpo(logp, old, adv, mask, is_ratio=theirs, loss_type="bnpo", epsilon_high=0.28), logp
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo_is_trls_rloo_loss(seed):
    logp, old, _, adv, mask = tensors(seed, spread=0.05)
    ours, _ = rloo_loss(logp, old, adv, mask, torch.ones_like(mask), clip_low=0.2, clip_high=0.2, num_seqs=B)
    trainer = fake_trainer(logp)
    inputs = dict(
        prompt_ids=torch.zeros(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.long),
        completion_ids=torch.zeros(B, T, dtype=torch.long),
        completion_mask=mask,
        advantages=adv,
        old_logps=(old * mask).sum(1),
    )
    same_loss_and_gradient(ours, RLOOTrainer._compute_loss(trainer, None, inputs), logp)
