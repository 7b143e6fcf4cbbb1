"""Dr. GRPO, "GRPO done right" (Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv 2503.20783).

A preset of SGRPO (`sgrpo.py`, same loss) that removes GRPO's two biases, as TRL's `dr_grpo` does:
- the advantage is not divided by the group's reward std (`adv_std_norm` is `none`), which over-weighted groups
  that were nearly all right or all wrong;
- each sample's token losses are summed and divided by one constant, `rollout.max_tokens`, not by the sample's own
  length (`loss_agg` is `seq-mean-token-sum-norm`), which rewarded long wrong answers;
- the clip is symmetric, 1 ± 0.2 (`clip_high` defaults to 0.2).
"""

from typing import Annotated

from pydantic import Field

from oxrl_core.algs import sgrpo
from oxrl_core.algs.aggregate import per_token_means
from oxrl_core.algs.base import Algorithm
from oxrl_core.algs.settings import Clip, KLPenalty, LossAgg, PolicyGradient


class DrGRPOSettings(PolicyGradient, KLPenalty, Clip):
    fixed = {
        "adv_std_norm": "Dr. GRPO does not scale advantages (none); --alg sgrpo chooses it",
        "loss_agg": "Dr. GRPO divides each sample's token sum by rollout.max_tokens (seq-mean-token-sum-norm); "
        "--alg sgrpo chooses it",
    }
    clip_high: Annotated[float, Field(ge=0)] = Field(
        0.2, description="Upper clip of the importance ratio: 1 + clip_high."
    )

    @property
    def adv_std_norm(self) -> str:
        return "none"

    @property
    def loss_agg(self) -> LossAgg:
        return "seq-mean-token-sum-norm"


ALGORITHM = Algorithm(
    "dr-grpo",
    "rl",
    "prompts",
    sgrpo.batch_loss,
    sgrpo.make_args,
    per_token_means,
    DrGRPOSettings,
    reference="kl",
    advantages="group",
    episodes=True,
)
