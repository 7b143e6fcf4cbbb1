"""What every reward shares: a sample it could not score, and a reward engine that failed."""

from dataclasses import dataclass

from oxrl_core.errors import OxrlError


@dataclass(frozen=True)
class Unscored:
    """What `score_batch` gives for a sample it could not score: why. The sample gets `reward.on_error`."""

    reason: str


class RewardUnavailable(OxrlError):
    """The reward's own engine failed (a judge's vLLM died): no sample of the step can be scored."""
