"""SPIN, self-play fine-tuning (Chen et al. 2024, arXiv 2401.01335).

Each of its `iterations` rounds pairs every demonstration (chosen) with the policy's own answer to its prompt
(rejected), sampled at the round's start, and trains on the pairs with DPO's loss against the policy at that start.
"""

from oxrl_core.algs import dpo
from oxrl_core.algs.base import Algorithm, check_iterations
from oxrl_core.algs.pairs import pair_means
from oxrl_core.algs.settings import Iterations
from oxrl_core.errors import OxrlError


def check(config) -> None:
    check_iterations(config)
    if config.data.val is not None:
        raise OxrlError(
            f"data.val={str(config.data.val)!r}: SPIN has no held-out measure (its rejected answers are "
            f"generated during training); leave data.val unset"
        )


class SPINSettings(Iterations, dpo.DPOLossSettings):
    pass


ALGORITHM = Algorithm(
    "spin",
    "sl",
    "demonstrations",
    dpo.batch_loss,
    dpo.make_args,
    pair_means,
    SPINSettings,
    reference="iteration",
    self_play="against-demonstration",
    per_iteration=True,
    check=check,
)
