"""GSPO-token (Zheng et al. 2025, arXiv 2507.18071, section 4.3): GSPO (`gspo.py`) whose ratio has, on every token,
the value of the sample's s_i and the gradient of that token alone: s_i,t = sg(s_i) exp(logp_t - sg(logp_t)).
When every token of a sample has the same advantage and the same correction weight (a sequence-level
`sampler_correction`, or none), its gradient equals GSPO's; with token-level weights each token's gradient is
weighted by its own."""

from dataclasses import replace

from oxrl_core.algs import gspo
from oxrl_core.algs.aggregate import per_token_means
from oxrl_core.algs.base import Algorithm, GlobalBatch


def make_args(settings: gspo.GSPOSettings, batch: GlobalBatch) -> gspo.GSPOArgs:
    return replace(gspo.make_args(settings, batch), token_gradients=True)


ALGORITHM = Algorithm(
    "gspo-token",
    "rl",
    "prompts",
    gspo.batch_loss,
    make_args,
    per_token_means,
    gspo.GSPOSettings,
    advantages="group",
    episodes=True,
)
