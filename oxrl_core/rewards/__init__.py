"""Verifiable rewards, selected by name or `module:function`, a trained reward model (`reward-model`) and an LLM
judge (`judge`, `rewards/judge.py`).

A reward is `fn(response: str, sample: dict, **kwargs) -> float`; `sample` is
the prompt record (with its ground truth, e.g. `answer` or `tests`). A reward
object may also have `score_batch(responses, samples) -> list[float | Unscored]`,
which the RL loop then calls once per group of samples instead.
"""

from collections.abc import Callable
from concurrent.futures import Executor
from functools import partial

from oxrl_core.errors import OxrlError
from oxrl_core.imports import shipped_or_imported
from oxrl_core.rewards.base import RewardUnavailable, Unscored
from oxrl_core.rewards.code import check_sandbox, code_reward
from oxrl_core.rewards.math import format_reward, gsm8k_reward, math_reward

RewardFn = Callable[[str, dict], float]
REWARDS: dict[str, RewardFn] = {
    "math": math_reward,
    "gsm8k": gsm8k_reward,
    "format": format_reward,
    "code": code_reward,
}
REWARD_MODEL_KWARGS = ("path", "batch_size")


def resolve_reward(func: str, kwargs: dict, judge=None) -> RewardFn | None:
    """A shipped reward by name, or any importable `module:function`; kwargs are bound now.
    `reward-model` loads the model now, `judge` (with the run's `reward.judge`) checks its settings and loads the
    judge's tokenizer, and `code` tries its sandbox, so that each fails before any engine starts. `env`: None, the
    environment of a multi-turn run scores each episode itself."""
    if func == "env":
        if kwargs:
            raise OxrlError(
                f"reward.kwargs: {', '.join(sorted(kwargs))} given for reward.func=env, whose environment "
                f"takes rollout.env.kwargs"
            )
        return None
    if func == "reward-model":
        return _reward_model(kwargs)
    if func == "judge":
        if judge is None:
            raise OxrlError("reward.func=judge: an LLM judge scores RL rollouts only (oxrl train rl)")
        if kwargs:
            raise OxrlError(
                f"reward.kwargs: {', '.join(sorted(kwargs))} given for reward.func=judge, whose settings are "
                f"under reward.judge"
            )
        from oxrl_core.rewards.judge import Judge

        return Judge(judge)
    if func == "code":
        check_sandbox(kwargs.get("sandbox", "jail"))
    fn = shipped_or_imported(func, REWARDS, "reward.func", "reward", [*REWARDS, "reward-model", "judge", "env"])
    if not callable(fn):
        raise OxrlError(f"reward.func={func!r}: not a function")
    return partial(fn, **kwargs) if kwargs else fn


def _reward_model(kwargs: dict):
    unknown = sorted(set(kwargs) - set(REWARD_MODEL_KWARGS))
    if unknown:
        raise OxrlError(
            f"reward.kwargs: unknown {', '.join(unknown)} for reward.func=reward-model; "
            f"allowed: {', '.join(REWARD_MODEL_KWARGS)}"
        )
    if "path" not in kwargs:
        raise OxrlError(
            "reward.func=reward-model needs reward.kwargs.path: the folder of a reward model "
            "(`oxrl train sl --alg rm` makes one)"
        )
    # Imported here: transformers' model classes take seconds to import and only this reward needs them.
    from oxrl_core.rewards.reward_model import RewardModel

    return RewardModel(**kwargs)


def score_samples(
    reward_fn, responses: list[str], samples: list[dict], on_error: float, workers: Executor | None = None
) -> tuple[list[float], list[dict]]:
    """Rewards of `responses` to their `samples`, and what went wrong: a user's reward must not end the run, so a
    failure scores `on_error` and comes back as {error, response, sample}. A reward with `score_batch` (a reward
    model, a judge) scores all of them in one call (a failure there spoils that call: every sample gets `on_error`,
    one error names the first; a sample it gives no score, `Unscored`, gets `on_error` and its own error); a
    function scores each one, on `workers`' threads if given (a sandbox or a remote service waits for several at
    once), else one after the other on this thread. `RewardUnavailable` is not a sample's failure: it ends the step."""
    if hasattr(reward_fn, "score_batch"):
        try:
            scored = reward_fn.score_batch(responses, samples)
            if len(scored) != len(responses):
                raise ValueError(f"score_batch returned {len(scored)} rewards for {len(responses)} responses")
            rewards = [on_error if isinstance(x, Unscored) else float(x) for x in scored]
        except RewardUnavailable:
            raise
        except Exception as e:
            return [on_error] * len(responses), [{"error": repr(e), "response": responses[0], "sample": samples[0]}]
        return rewards, [
            {"error": x.reason, "response": response, "sample": sample}
            for x, response, sample in zip(scored, responses, samples)
            if isinstance(x, Unscored)
        ]

    def score(response: str, sample: dict) -> tuple[float, dict | None]:
        try:
            return float(reward_fn(response, sample)), None
        except Exception as e:
            return on_error, {"error": repr(e), "response": response, "sample": sample}

    scored = list(workers.map(score, responses, samples) if workers else map(score, responses, samples))
    return [reward for reward, _ in scored], [error for _, error in scored if error is not None]
