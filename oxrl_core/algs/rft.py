"""RFT, rejection-sampling fine-tuning (Yuan et al. 2023, "Scaling Relationship on Learning Mathematical Reasoning
with Large Language Models", arXiv 2308.01825; STaR, Zelikman et al. 2022, arXiv 2203.14465).

Each of `train.iterations` rounds samples `rollout.n_samples` answers per prompt from the policy as it is at the
round's start, keeps the distinct ones whose reward reaches `train.rft_threshold`, and trains on them with SFT's loss.
"""

from oxrl_core.algs import sft
from oxrl_core.algs.base import Algorithm, check_iterations

ALGORITHM = Algorithm("rft", "sl", "prompts", sft.batch_loss, sft.make_args, self_play="passing", per_iteration=True,
                      check=check_iterations)
