"""A reward as slow as a code sandbox or a remote judge, for rl_step.py's `--slow-reward`: the math reward after
`delay_s` seconds of waiting per sample (a sleep: it holds no CPU, as waiting on another process does)."""

import time

from oxrl_core.rewards.math import math_reward


def math_after_delay(response: str, sample: dict, delay_s: float) -> float:
    time.sleep(delay_s)
    return math_reward(response, sample)
