"""Verifiable rewards, selected by name or `module:function`.

A reward is `fn(response: str, sample: dict, **kwargs) -> float`; `sample` is
the prompt record (with its ground truth, e.g. `answer` or `tests`).
"""

import importlib
from collections.abc import Callable
from functools import partial

from oxrl_core.errors import OxrlError
from oxrl_core.rewards.code import code_reward
from oxrl_core.rewards.math import format_reward, gsm8k_reward, math_reward

RewardFn = Callable[[str, dict], float]
REWARDS: dict[str, RewardFn] = {"math": math_reward, "gsm8k": gsm8k_reward, "format": format_reward, "code": code_reward}


def resolve_reward(spec: str, kwargs: dict) -> RewardFn:
    """A shipped reward by name, or any importable `module:function`; kwargs are bound now."""
    if spec in REWARDS:
        fn = REWARDS[spec]
    elif ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise OxrlError(f"reward.func={spec!r}: cannot import ({e})") from None
        if not callable(fn):
            raise OxrlError(f"reward.func={spec!r}: not a function")
    else:
        raise OxrlError(f"reward.func={spec!r}: not a shipped reward ({', '.join(REWARDS)}) and not module:function")
    return partial(fn, **kwargs) if kwargs else fn
