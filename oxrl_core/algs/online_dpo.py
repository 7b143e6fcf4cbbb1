"""Online DPO (Guo et al. 2024, "Direct Language Model Alignment from Online AI Feedback", arXiv 2402.04792).

At every step the policy samples `rollout.n_samples` answers per prompt; `reward.func` scores them, and each prompt's
best answer over its worst becomes a DPO pair, trained against a frozen reference model. A prompt whose samples all
score the same gives no preference: its pair is masked out.
"""

from oxrl_core.algs import dpo
from oxrl_core.algs.base import Algorithm
from oxrl_core.algs.pairs import pair_means
from oxrl_core.errors import OxrlError


def check(config) -> None:
    if config.rollout.n_samples < 2:
        raise OxrlError(
            f"rollout.n_samples={config.rollout.n_samples}: Online DPO pairs the best and the worst of at "
            f"least 2 samples per prompt"
        )


ALGORITHM = Algorithm(
    "online-dpo",
    "sl",
    "prompts",
    dpo.batch_loss,
    dpo.make_args,
    pair_means,
    dpo.DPOLossSettings,
    reference="model",
    self_play="best-over-worst",
    check=check,
)
