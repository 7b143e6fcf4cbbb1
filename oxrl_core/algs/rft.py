"""RFT, rejection-sampling fine-tuning (Yuan et al. 2023, "Scaling Relationship on Learning Mathematical Reasoning
with Large Language Models", arXiv 2308.01825; STaR, Zelikman et al. 2022, arXiv 2203.14465).

Each of its `iterations` rounds samples `rollout.n_samples` answers per prompt from the policy as it is at the
round's start, keeps the distinct ones whose reward reaches its `threshold`, and trains on them with SFT's loss.
"""

from pydantic import Field

from oxrl_core.algs import sft
from oxrl_core.algs.base import Algorithm, check_iterations
from oxrl_core.algs.settings import Iterations


class RFTSettings(Iterations):
    threshold: float = Field(1.0, description="Keep sampled completions whose reward is at least this.")


ALGORITHM = Algorithm(
    "rft",
    "sl",
    "prompts",
    sft.batch_loss,
    sft.make_args,
    sft.nll_means,
    RFTSettings,
    self_play="passing",
    per_iteration=True,
    check=check_iterations,
)
