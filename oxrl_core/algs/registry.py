"""Algorithm name -> how its loss reads a training micro-batch.

The training engine looks losses up here by name (names travel to Ray actors;
functions need not). Each adapter only unpacks the model's outputs (`logprobs`,
and for PPO `values` and `entropy`, all [B, T-1]) and the batch dict; the math is
in the algorithm's own file.
"""

import torch

from oxrl_core.algs.cispo import cispo_loss
from oxrl_core.algs.ppo import ppo_loss
from oxrl_core.algs.sft import sft_loss
from oxrl_core.algs.sgrpo import sgrpo_loss

Batch = dict[str, torch.Tensor]


def _sft(outputs: Batch, batch: Batch, **kw):
    return sft_loss(outputs["logprobs"], batch["response_mask"], **kw)


def _sgrpo(outputs: Batch, batch: Batch, **kw):
    return sgrpo_loss(outputs["logprobs"], batch["old_logprobs"], batch["advantages"], batch["response_mask"],
                      batch.get("ref_logprobs"), **kw)


def _cispo(outputs: Batch, batch: Batch, **kw):
    return cispo_loss(outputs["logprobs"], batch["old_logprobs"], batch["advantages"], batch["response_mask"], **kw)


def _ppo(outputs: Batch, batch: Batch, **kw):
    return ppo_loss(outputs["logprobs"], batch["old_logprobs"], batch["advantages"], batch["response_mask"],
                    outputs["values"].float(), batch["old_values"], batch["returns"], outputs["entropy"], **kw)


BATCH_LOSSES = {"sft": _sft, "sgrpo": _sgrpo, "cispo": _cispo, "ppo": _ppo}
