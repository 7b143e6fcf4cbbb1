"""Verifiable rewards, selected by name or `module:function`, and a trained reward model (`reward-model`).

A reward is `fn(response: str, sample: dict, **kwargs) -> float`; `sample` is
the prompt record (with its ground truth, e.g. `answer` or `tests`). A reward
object may also have `score_batch(responses, samples) -> list[float]`, which
the RL loop then calls once per step instead.
"""

import importlib
from collections.abc import Callable
from functools import partial

from oxrl_core.errors import OxrlError
from oxrl_core.rewards.code import check_sandbox, code_reward
from oxrl_core.rewards.math import format_reward, gsm8k_reward, math_reward

RewardFn = Callable[[str, dict], float]
REWARDS: dict[str, RewardFn] = {"math": math_reward, "gsm8k": gsm8k_reward, "format": format_reward, "code": code_reward}
REWARD_MODEL_KWARGS = ("path", "batch_size")


def resolve_reward(spec: str, kwargs: dict) -> RewardFn:
    """A shipped reward by name, or any importable `module:function`; kwargs are bound now.
    `reward-model` loads the model now, and `code` tries its sandbox, so that either fails before any engine starts."""
    if spec == "reward-model":
        return _reward_model(kwargs)
    if spec == "code":
        check_sandbox(kwargs.get("sandbox", "jail"))
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
        raise OxrlError(f"reward.func={spec!r}: not a shipped reward ({', '.join([*REWARDS, 'reward-model'])}) and not module:function")
    return partial(fn, **kwargs) if kwargs else fn


def _reward_model(kwargs: dict):
    unknown = sorted(set(kwargs) - set(REWARD_MODEL_KWARGS))
    if unknown:
        raise OxrlError(f"reward.kwargs: unknown {', '.join(unknown)} for reward.func=reward-model; "
                        f"allowed: {', '.join(REWARD_MODEL_KWARGS)}")
    if "path" not in kwargs:
        raise OxrlError("reward.func=reward-model needs reward.kwargs.path: the folder of a reward model "
                        "(`oxrl train sl --alg rm` makes one)")
    # Imported here: transformers' model classes take seconds to import and only this reward needs them.
    from oxrl_core.rewards.reward_model import RewardModel

    return RewardModel(**kwargs)


def score_samples(reward_fn, responses: list[str], samples: list[dict], on_error: float) -> tuple[list[float], list[dict]]:
    """Rewards of `responses` to their `samples`, and what went wrong: a user's reward must not end the run, so a
    failure scores `on_error` and comes back as {error, response, sample}. A reward with `score_batch` (a reward
    model) scores all of them in one call (a failure there spoils that call: every sample gets `on_error`, one
    error names the first); a function scores each one."""
    if hasattr(reward_fn, "score_batch"):
        try:
            rewards = [float(x) for x in reward_fn.score_batch(responses, samples)]
            if len(rewards) != len(responses):
                raise ValueError(f"score_batch returned {len(rewards)} rewards for {len(responses)} responses")
            return rewards, []
        except Exception as e:
            return [on_error] * len(responses), [{"error": repr(e), "response": responses[0], "sample": samples[0]}]
    rewards, errors = [], []
    for response, sample in zip(responses, samples):
        try:
            rewards.append(float(reward_fn(response, sample)))
        except Exception as e:
            rewards.append(on_error)
            errors.append({"error": repr(e), "response": response, "sample": sample})
    return rewards, errors
