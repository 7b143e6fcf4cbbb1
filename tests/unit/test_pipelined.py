"""Pipelined RL (rollout.lag, rollout.max_staleness): their settings, the staleness guard, and what a checkpoint keeps
of the batches sampled ahead."""

import json
import threading
import time
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from oxrl_core.cluster.placement import Placement
from oxrl_core.config.load import load_config
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.errors import OxrlError
from oxrl_core.loops.crash import timed
from oxrl_core.loops.guards import StalePolicyError, check_staleness
from oxrl_core.loops.recipes.policy_gradient import PolicyGradient, SampledBatch, shared_gpus_note
from oxrl_core.resolve.run import resolved
from oxrl_core.rollout.records import Rollout


@pytest.mark.parametrize(
    "alg, overrides, correction",
    [
        ("cispo", [], "token-truncate"),
        ("cispo", ["train.cispo.sampler_correction=none"], "none"),
        ("rloo", [], "sequence-truncate"),
    ],
)  # the algorithm's own
def test_a_lag_corrects_for_the_older_sampler_unless_the_config_or_algorithm_says_otherwise(
    tmp_path, alg, overrides, correction
):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    base = [f"train.alg={alg}", f"data.train=[{{path: {data}}}]", f"run.output_dir={tmp_path}"]
    lagged = load_config(RLConfig, None, [*base, "rollout.lag=1", *overrides])
    resolved(lagged)
    assert lagged.train.settings.sampler_correction == correction
    on_policy = load_config(RLConfig, None, base)
    resolved(on_policy)
    assert on_policy.train.settings.sampler_correction == ("sequence-truncate" if alg == "rloo" else "none")


def test_a_batch_sampled_ahead_comes_back_from_its_checkpoint_state_the_same_with_its_prompts_media_and_routes():
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    routes = np.array([[[3, 0], [7, 2]], [[-1, -1], [1, 5]], [[6, 4], [0, 1]]], dtype=np.int16)  # [3 positions, 2, 2]
    prompt_sets = [[SimpleNamespace(media=())], [SimpleNamespace(media=()), SimpleNamespace(media=(image,))]]
    rollouts = [
        Rollout(0, [1, 2], [3, 4], [-0.1, -2.5e-7], "stop", 4, reward=0.75, media=(image,), routes=routes),
        Rollout(1, [1], [5], [-1 / 3], "length", 4, reward=-1.0, policy_mask=[1], env_reward=0.5),
    ]
    batch = SampledBatch(rollouts, [(1, 1), (0, 0)], 4, {"generated_tokens": 3}, {"generate": 1.5})
    back = SampledBatch.from_state(json.loads(json.dumps(batch.state())), prompt_sets)
    assert back.prompts == batch.prompts and back.policy_version == 4
    assert back.metrics == batch.metrics and back.seconds == batch.seconds
    for a, b in zip(back.rollouts, rollouts):
        assert (
            a.group,
            a.prompt_ids,
            a.response_ids,
            a.finish_reason,
            a.policy_version,
            a.reward,
            a.policy_mask,
            a.env_reward,
        ) == (
            b.group,
            b.prompt_ids,
            b.response_ids,
            b.finish_reason,
            b.policy_version,
            b.reward,
            b.policy_mask,
            b.env_reward,
        )
        assert a.sampler_logprobs == b.sampler_logprobs  # floats exactly: JSON keeps every bit of a float
        assert len(a.media) == len(b.media) and all(np.array_equal(x, y) for x, y in zip(a.media, b.media))
        assert (a.routes is None) == (b.routes is None)
    assert back.rollouts[0].routes.dtype == np.int16 and np.array_equal(back.rollouts[0].routes, routes)


def test_a_supervised_run_that_samples_refuses_a_lag(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    config = load_config(
        SLConfig,
        None,
        ["train.alg=rft", f"data.train=[{{path: {data}}}]", f"run.output_dir={tmp_path}", "rollout.lag=1"],
    )
    with pytest.raises(OxrlError, match="rollout.lag=1: pipelined sampling is for `oxrl train rl`; --alg rft"):
        resolved(config)


def test_a_supervised_run_refuses_asynchronous_sampling_and_a_lag_with_a_staleness_bound_is_refused(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    base = [f"data.train=[{{path: {data}}}]", f"run.output_dir={tmp_path}"]
    with pytest.raises(OxrlError, match="rollout.max_staleness=2: pipelined sampling is for `oxrl train rl`"):
        resolved(load_config(SLConfig, None, ["train.alg=rft", *base, "rollout.max_staleness=2"]))
    with pytest.raises(OxrlError, match="rollout.lag=1 and rollout.max_staleness=2: choose one"):
        resolved(load_config(RLConfig, None, ["train.alg=cispo", *base, "rollout.lag=1", "rollout.max_staleness=2"]))
    asynchronous = load_config(RLConfig, None, ["train.alg=cispo", *base, "rollout.max_staleness=2"])
    resolved(asynchronous)
    assert asynchronous.train.settings.sampler_correction == "token-truncate"


def test_a_sample_older_than_the_staleness_bound_is_refused_and_one_at_the_bound_is_not():
    check_staleness([0, 2, 1], bound=2)
    with pytest.raises(
        StalePolicyError,
        match=r"sample 1 is 3 policy versions older than the trainer, more than "
        r"rollout.max_staleness=2 \(1 of 3 samples\)",
    ):
        check_staleness([0, 3, 1], bound=2)


def test_the_checkpoint_of_an_asynchronous_run_keeps_the_sampler_where_the_first_untrained_batch_was_drawn():
    pg = object.__new__(PolicyGradient)
    pg.sampler, pg.pending, pg.policy_version = SimpleNamespace(state_dict=lambda: {"drawn": 9}), deque(), 4
    pg.sampler_before, pg.last_trained = {5: {"drawn": 5}, 6: {"drawn": 6}}, 4
    assert pg.loop_state()["sampler"] == {"drawn": 5}
    pg.last_trained = 6  # nothing drawn past the last step: the sampler as it is
    assert pg.loop_state() == {"sampler": {"drawn": 9}, "policy_version": 4, "pending": []}


def test_a_slowed_trainer_trains_no_sample_older_than_the_staleness_bound_while_the_engines_run_ahead():
    """Asynchronous at max_staleness 2, engines that sample at once and a trainer that takes its time: the engines
    run exactly as far ahead as the bound allows, so every batch from step 3 on is 2 versions old when trained."""
    bound, steps = 2, 8
    pg = object.__new__(PolicyGradient)
    pg.staleness, pg.policy_version, pg.last_trained = bound, 0, 0
    pg.train, pg.rollout = SimpleNamespace(steps=steps, batch_size=4), SimpleNamespace(n_samples=2)
    pg.sampler = SimpleNamespace(state_dict=dict, next_batch=lambda count: [(0, 0)] * count)
    pg.in_flight, pg.sampler_before = {}, {}
    pg.trained, pg.drawing = threading.Condition(), threading.Lock()
    pg.run = SimpleNamespace(position=SimpleNamespace(timed=timed))
    started = {}  # step -> the policy version the engines held when its batch started

    def sample(step, timer, drawn):
        started[step] = pg.policy_version
        return SimpleNamespace(policy_version=started[step])

    pg.sample = sample
    ages = []
    for step in range(1, steps + 1):
        batch = pg.take_async(step, {})
        ages.append(pg.policy_version - batch.policy_version)
        while min(step + bound, steps) not in started:  # the trainer is slow: the engines get as far as they may
            time.sleep(0.001)
        time.sleep(0.05)  # and would go further if they were let
        assert max(started) == min(step + bound, steps)
        with pg.trained:
            pg.policy_version, pg.last_trained = pg.policy_version + 1, step
            pg.trained.notify_all()
    assert ages == [0, 1, 2, 2, 2, 2, 2, 2]


@pytest.mark.parametrize(
    "mode, on_gpu, lag, staleness, noted",
    [
        ("colocated", True, 1, 0, True),
        ("colocated", True, 0, 2, True),  # engines and ranks take turns on each GPU
        ("colocated", True, 0, 0, False),  # strictly on-policy: nothing overlaps
        ("split", True, 1, 0, False),  # the engines have GPUs of their own
        ("colocated", False, 1, 0, False),  # CPU: an engine shares its rank's slot, nothing measured there
    ],
)
def test_a_pipelined_run_is_told_when_its_engines_share_the_trainers_gpus(mode, on_gpu, lag, staleness, noted):
    note = shared_gpus_note(lag, staleness, Placement(mode, on_gpu, train_ranks=2, engines=2, tensor_parallel_size=1))
    assert (note is not None) == noted
    if noted:
        assert "rollout.placement=split" in note and "take turns" in note
