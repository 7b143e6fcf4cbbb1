"""Algorithm name -> how its loss reads a training micro-batch, and what each supervised algorithm needs.

The training engine looks losses up here by name (names travel to Ray actors;
functions need not). Each adapter only unpacks the model's outputs (`logprobs`,
and for PPO `values` and `entropy`, all [B, T-1]; KD's `logits` and `teacher_logits`
[B, T-1, V], which its adapter turns into a per-token KL; a reward model's `scores` [B])
and the batch dict; the math is in the algorithm's own file. Pair algorithms see one micro-batch of N pairs as 2N rows:
the chosen sides first, then the rejected sides in the same order.
"""

from dataclasses import dataclass
from typing import Literal

import torch

from oxrl_core.algs.cispo import cispo_loss
from oxrl_core.algs.dpo import dpo_loss
from oxrl_core.algs.ipo import ipo_loss
from oxrl_core.algs.kd import kd_loss
from oxrl_core.algs.kto import kto_loss
from oxrl_core.algs.orpo import orpo_loss
from oxrl_core.algs.ppo import ppo_loss
from oxrl_core.algs.rm import rm_loss
from oxrl_core.algs.sft import sft_loss
from oxrl_core.algs.sgrpo import sgrpo_loss
from oxrl_core.algs.simpo import simpo_loss
from oxrl_core.training.logprobs import token_kl

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class SLAlgorithm:
    data: Literal["conversations", "pairs", "unpaired", "text", "prompts", "demonstrations"]  # what data.train holds
    loss: str  # the BATCH_LOSSES entry its training steps use
    reference: bool  # needs reference logprobs (of the starting model)
    generates: bool  # trains on the policy's own vLLM samples


SL_ALGORITHMS = {
    "sft": SLAlgorithm("conversations", "sft", reference=False, generates=False),
    "cpt": SLAlgorithm("text", "sft", reference=False, generates=False),
    "kd": SLAlgorithm("conversations", "kd", reference=False, generates=False),
    "dpo": SLAlgorithm("pairs", "dpo", reference=True, generates=False),
    "ipo": SLAlgorithm("pairs", "ipo", reference=True, generates=False),
    "simpo": SLAlgorithm("pairs", "simpo", reference=False, generates=False),
    "orpo": SLAlgorithm("pairs", "orpo", reference=False, generates=False),
    "rm": SLAlgorithm("pairs", "rm", reference=False, generates=False),
    "kto": SLAlgorithm("unpaired", "kto", reference=True, generates=False),
    "rft": SLAlgorithm("prompts", "sft", reference=False, generates=True),
    "spin": SLAlgorithm("demonstrations", "dpo", reference=True, generates=True),
    "online-dpo": SLAlgorithm("prompts", "dpo", reference=True, generates=True),
}


def uses_rollout(config) -> bool:
    """Whether a run (SLConfig or RLConfig) samples from its policy with vLLM engines: RL, and RFT, SPIN, Online DPO."""
    alg = config.train.alg
    return alg not in SL_ALGORITHMS or SL_ALGORITHMS[alg].generates


def uses_reward(config) -> bool:
    """Whether a run (SLConfig or RLConfig) scores samples with `reward.func`: RL, and RFT and Online DPO."""
    alg = config.train.alg
    return alg not in SL_ALGORITHMS or SL_ALGORITHMS[alg].data == "prompts"


def _sequence_sums(outputs: Batch, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the sum of its response tokens' logprobs and their number, both [rows]."""
    mask = batch["response_mask"]
    return (outputs["logprobs"] * mask).sum(-1), mask.sum(-1)


def _pairs(outputs: Batch, batch: Batch) -> tuple[torch.Tensor, ...]:
    """(chosen_logps, rejected_logps, chosen_lengths, rejected_lengths), each [N]."""
    logps, lengths = _sequence_sums(outputs, batch)
    return (*logps.chunk(2), *lengths.chunk(2))


def _sft(outputs: Batch, batch: Batch, **kw):
    return sft_loss(outputs["logprobs"], batch["response_mask"], **kw)


def _dpo(outputs: Batch, batch: Batch, **kw):
    chosen, rejected, chosen_len, rejected_len = _pairs(outputs, batch)
    return dpo_loss(chosen, rejected, *batch["ref_logps"].chunk(2), chosen_len, rejected_len, **kw)


def _ipo(outputs: Batch, batch: Batch, **kw):
    chosen, rejected, chosen_len, rejected_len = _pairs(outputs, batch)
    return ipo_loss(chosen, rejected, *batch["ref_logps"].chunk(2), chosen_len, rejected_len, **kw)


def _simpo(outputs: Batch, batch: Batch, **kw):
    return simpo_loss(*_pairs(outputs, batch), **kw)


def _orpo(outputs: Batch, batch: Batch, **kw):
    return orpo_loss(*_pairs(outputs, batch), **kw)


def _rm(outputs: Batch, batch: Batch, **kw):
    chosen_len, rejected_len = batch["response_mask"].sum(-1).chunk(2)
    return rm_loss(*outputs["scores"].float().chunk(2), batch["margin"], chosen_len, rejected_len, **kw)


def _kto(outputs: Batch, batch: Batch, **kw):
    logps, lengths = _sequence_sums(outputs, batch)
    return kto_loss(logps, batch["ref_logps"], lengths, batch["desirable"], **kw)


def _kd(outputs: Batch, batch: Batch, **kw):
    kl = token_kl(outputs["logits"], outputs["teacher_logits"], kw["temperature"])  # [B, T-1], row by row
    return kd_loss(kl, outputs["logprobs"], batch["response_mask"], **kw)


def _sgrpo(outputs: Batch, batch: Batch, **kw):
    return sgrpo_loss(outputs["logprobs"], batch["old_logprobs"], batch["advantages"], batch["response_mask"],
                      batch.get("ref_logprobs"), **kw)


def _cispo(outputs: Batch, batch: Batch, **kw):
    return cispo_loss(outputs["logprobs"], batch["old_logprobs"], batch["advantages"], batch["response_mask"], **kw)


def _ppo(outputs: Batch, batch: Batch, **kw):
    return ppo_loss(outputs["logprobs"], batch["old_logprobs"], batch["advantages"], batch["response_mask"],
                    outputs["values"].float(), batch["old_values"], batch["returns"], outputs["entropy"], **kw)


BATCH_LOSSES = {"sft": _sft, "dpo": _dpo, "ipo": _ipo, "simpo": _simpo, "orpo": _orpo, "rm": _rm, "kto": _kto, "kd": _kd,
                "sgrpo": _sgrpo, "cispo": _cispo, "ppo": _ppo}
