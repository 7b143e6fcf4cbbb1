"""REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262; OpenRLHF's `reinforce_baseline`): REINFORCE++
(`reinforce_pp.py`, same loss) whose rewards first lose their prompt's mean reward, a baseline from the group of
samples that needs no critic; unlike GRPO, nothing is divided by the group's std, and the advantages are normalised
over the whole batch."""

from oxrl_core.algs import reinforce_pp
from oxrl_core.algs.aggregate import per_token_means
from oxrl_core.algs.base import Algorithm

ALGORITHM = Algorithm(
    "reinforce++-baseline",
    "rl",
    "prompts",
    reinforce_pp.batch_loss,
    reinforce_pp.make_args,
    per_token_means,
    reinforce_pp.ReinforcePPSettings,
    reference="kl",
    advantages="reinforce++-baseline",
)
