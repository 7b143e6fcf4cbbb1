"""Dr. GRPO, "GRPO done right" (Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv 2503.20783).

A preset of SGRPO (`sgrpo.py`, same loss) that removes GRPO's two biases, as TRL's `dr_grpo` does:
- the advantage is not divided by the group's reward std (`train.adv_std_norm: none`), which over-weighted groups
  that were nearly all right or all wrong;
- each sample's token losses are summed and divided by one constant, `rollout.max_tokens`, not by the sample's own
  length (`train.loss_agg: seq-mean-token-sum-norm`), which rewarded long wrong answers;
- the clip is symmetric, 1 ± 0.2 (`train.clip_high: 0.2`).
"""

from oxrl_core.algs import sgrpo
from oxrl_core.algs.base import Algorithm
from oxrl_core.errors import OxrlError

DEFAULTS = {"adv_std_norm": "none", "loss_agg": "seq-mean-token-sum-norm", "clip_high": 0.2}


def check(config) -> None:
    """The two settings that make it Dr. GRPO are refused if set otherwise."""
    for key in ("adv_std_norm", "loss_agg"):
        if key in config.train.model_fields_set and getattr(config.train, key) != DEFAULTS[key]:
            raise OxrlError(f"train.{key}={getattr(config.train, key)!r}: Dr. GRPO is {key}={DEFAULTS[key]!r}; use "
                            f"--alg sgrpo to choose it")


ALGORITHM = Algorithm("dr-grpo", "rl", "prompts", sgrpo.batch_loss, sgrpo.make_args, reference="kl", advantages="group",
                      episodes=True, defaults=DEFAULTS, check=check)
