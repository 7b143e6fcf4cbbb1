"""Algorithm name -> how its loss reads a training micro-batch.

The training engine looks losses up here by name (names travel to Ray actors;
functions need not). Each adapter only unpacks the batch dict; the math is in
the algorithm's own file.
"""

import torch

from oxrl_core.algs.cispo import cispo_loss
from oxrl_core.algs.sft import sft_loss
from oxrl_core.algs.sgrpo import sgrpo_loss

Batch = dict[str, torch.Tensor]


def _sft(logprobs: torch.Tensor, batch: Batch, **kw):
    return sft_loss(logprobs, batch["response_mask"], **kw)


def _sgrpo(logprobs: torch.Tensor, batch: Batch, **kw):
    return sgrpo_loss(logprobs, batch["old_logprobs"], batch["advantages"], batch["response_mask"],
                      batch.get("ref_logprobs"), **kw)


def _cispo(logprobs: torch.Tensor, batch: Batch, **kw):
    return cispo_loss(logprobs, batch["old_logprobs"], batch["advantages"], batch["response_mask"], **kw)


BATCH_LOSSES = {"sft": _sft, "sgrpo": _sgrpo, "cispo": _cispo}
