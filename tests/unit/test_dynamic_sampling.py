"""DAPO's dynamic sampling in the policy-gradient recipe: groups whose rewards are all equal are dropped and the batch is
refilled from further prompts; when no round finds enough, the run stops with a message after its bound."""

import threading
from types import SimpleNamespace

import pytest

from oxrl_core.data.sampler import MixedSampler
from oxrl_core.errors import OxrlError
from oxrl_core.loops.crash import RunPosition
from oxrl_core.loops.recipes.policy_gradient import PolicyGradient, SamplingStopped
from oxrl_core.rollout.records import Rollout

N_SAMPLES = 2


def recipe(prompt_rewards: list[list[float]], groups: int, rounds: int, dynamic: bool = True) -> PolicyGradient:
    """The recipe with a fake engine and reward: prompt k's samples score `prompt_rewards[k]`."""
    calls = []

    def generate(prompts, n, temperature, seed_base):
        calls.append([p.record["id"] for p in prompts])
        for g, p in reversed(list(enumerate(prompts))):  # groups end in any order
            yield [
                Rollout(
                    group=g,
                    prompt_ids=[p.record["id"]],
                    response_ids=[1, 2, 3],
                    sampler_logprobs=[0.0] * 3,
                    finish_reason="stop",
                    policy_version=0,
                )
                for _ in range(n)
            ]

    def score(rollouts, records, step):
        seen = {}
        for r in rollouts:
            r.reward = records[r.group]["rewards"][seen.setdefault(r.group, 0)]
            seen[r.group] += 1

    prompts = [SimpleNamespace(record={"id": k, "rewards": rewards}) for k, rewards in enumerate(prompt_rewards)]
    pg = object.__new__(PolicyGradient)
    pg.algorithm = SimpleNamespace(name="dapo", dynamic_sampling=dynamic)
    pg.train = SimpleNamespace(batch_size=groups * N_SAMPLES, seed=0)
    pg.settings = SimpleNamespace(max_sampling_rounds=rounds)
    pg.rollout = SimpleNamespace(n_samples=N_SAMPLES, temperature=1.0)
    pg.prompt_sets, pg.sampler, pg.new_env = [prompts], MixedSampler([len(prompts)], [1.0], seed=0), None
    pg.generate, pg.calls, pg.policy_version = generate, calls, 0
    pg.scoring, pg.drawing = threading.Lock(), threading.Lock()
    pg.run = SimpleNamespace(
        position=RunPosition(),
        score=score,
        reward_fn=None,
        first_step=1,
        run_dir="run",
        config=SimpleNamespace(reward=SimpleNamespace(overlong_buffer=0)),
    )
    return pg


def test_uniform_groups_are_dropped_and_the_batch_is_refilled_to_full_size():
    half_uniform = [[1.0, 1.0] if k % 2 else [0.0, 1.0] for k in range(40)]
    pg = recipe(half_uniform, groups=4, rounds=10)
    sampled = pg.sample(step=1, timer=pg.run.position.timed)
    rollouts, metrics, seconds = sampled.rollouts, sampled.metrics, sampled.seconds
    assert len(rollouts) == 4 * N_SAMPLES
    assert [r.group for r in rollouts] == [0, 0, 1, 1, 2, 2, 3, 3]
    for g in range(4):
        assert sorted(r.reward for r in rollouts if r.group == g) == [0.0, 1.0]
    drawn = [k for call in pg.calls for k in call]
    assert len(pg.calls) == metrics["sampling_rounds"] >= 2
    assert [len(call) for call in pg.calls[1:]] == [
        4 - sum(k % 2 == 0 for c in pg.calls[: i + 1] for k in c) for i in range(len(pg.calls) - 1)
    ]  # each round asks what is missing
    assert metrics["groups_dropped"] == sum(k % 2 for k in drawn) > 0
    assert len(set(drawn)) == len(drawn)  # further prompts, never the same again
    assert [k for k, _ in sampled.prompts] == [0] * 4 and [i for _, i in sampled.prompts] == [
        k for k in drawn if k % 2 == 0
    ]
    assert "resample" in seconds and "generate" in seconds


def test_when_every_group_is_uniform_the_run_stops_after_its_rounds_with_a_message():
    pg = recipe([[1.0, 1.0]] * 40, groups=4, rounds=3)
    before = pg.sampler.state_dict()
    with pytest.raises(
        SamplingStopped,
        match=r"dynamic sampling: after 3 rounds \(train.dapo.max_sampling_rounds\) only 0 "
        r"of the 4 prompt groups .* \(12 groups scored the same",
    ) as stopped:
        pg.sample(step=1, timer=pg.run.position.timed)
    with pytest.raises(
        OxrlError, match="12 groups scored the same.*; stopped at step 1: no step had finished, run again"
    ):
        pg.stop(0, str(stopped.value))  # what the step does with it
    assert len(pg.calls) == 3
    assert pg.sampler.state_dict() == before  # --resume draws the stopped step's prompts again


def test_without_dynamic_sampling_uniform_groups_are_trained_on():
    pg = recipe([[1.0, 1.0]] * 40, groups=4, rounds=3, dynamic=False)
    sampled = pg.sample(step=1, timer=pg.run.position.timed)
    rollouts, metrics = sampled.rollouts, sampled.metrics
    assert len(rollouts) == 8 and len(pg.calls) == 1 and metrics == {"generated_tokens": 24}
