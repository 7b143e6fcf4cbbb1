"""The engines' stream (rollout/stream.py) and the recipe's scoring as groups end, against fake engines that sample
one token a step for every request they hold, answering on threads of their own after random delays."""

import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from types import SimpleNamespace

import pytest

from oxrl_core.loops.recipes.policy_gradient import PolicyGradient
from oxrl_core.rollout.engine import ADVANCE_STEPS
from oxrl_core.rollout.records import Completion, SampleRequest
from oxrl_core.rollout.stream import QUEUED_CALLS, EngineStream


class FakeEngine:
    """`advance` as RolloutEngine's: a request's sample is `max_tokens` tokens long (token ids: its key)."""

    def __init__(self, name: int, fail_on_call: int | None = None):
        self.name, self.fail_on_call = name, fail_on_call
        self.running, self.calls, self.finished_at = {}, [], {}
        self.thread = ThreadPoolExecutor(1)
        self.advance = SimpleNamespace(remote=lambda requests: self.thread.submit(self._advance, requests))
        self.steps = 0

    def _advance(self, requests):
        time.sleep(random.uniform(0, 0.003))  # answers come back in any order across engines
        self.calls.append([(r.max_tokens, r.prompt_ids) for r in requests])  # what it was asked, not the stream's keys
        if len(self.calls) == self.fail_on_call:
            raise RuntimeError(f"engine {self.name} died")
        for r in requests:
            self.running[r.key] = [r, 0]
        finished, steps = [], 0
        while self.running and steps < ADVANCE_STEPS:
            self.steps, steps = self.steps + 1, steps + 1
            for key in list(self.running):
                self.running[key][1] += 1
                r, sampled = self.running[key]
                if sampled == r.max_tokens:
                    del self.running[key]
                    self.finished_at[r.max_tokens, tuple(r.prompt_ids)] = self.steps
                    finished.append(Completion(key, [self.name] * sampled, [-1.0] * sampled, "stop", [(0, 0)]))
        return finished


class FakeWatch:
    def first(self, refs, phase):
        done, _ = wait(refs, return_when=FIRST_COMPLETED)
        ref = random.choice(list(done))
        return ref, ref.result()

    def get(self, refs, phase):
        return [r.result() for r in refs]


def request(key: int, length: int, prompt: tuple = ()) -> SampleRequest:
    return SampleRequest(key, list(prompt), length, seed=key, temperature=1.0, top_p=1.0)


def test_each_sample_comes_out_as_it_ends_on_the_engine_of_its_group():
    engines = [FakeEngine(0), FakeEngine(1)]
    stream = EngineStream([[e] for e in engines], FakeWatch())
    lengths = [40, 3, 20, 7, 90, 1]
    out = list(stream.submit([request(k, n) for k, n in enumerate(lengths)], engines=[k % 2 for k in range(6)]))
    assert sorted(c.key for c in out) == list(range(6))
    for c in out:
        assert c.token_ids == [c.key % 2] * lengths[c.key]  # sampled by its group's engine
    for e in engines:  # within an engine, in the order they ended
        mine = [c.key for c in out if c.key % 2 == e.name]
        assert mine == sorted(mine, key=lambda k: lengths[k])


def test_a_follow_up_goes_to_the_same_engine_and_the_same_requests_give_the_same_calls_whatever_the_timing():
    def run():
        engines = [FakeEngine(0), FakeEngine(1)]
        stream = EngineStream([[e] for e in engines], FakeWatch())
        turns = {}

        def follow_up(done):  # each sample gets two more turns, the context growing by what it sampled
            turns[done.key] = turns.get(done.key, 0) + 1
            return [] if turns[done.key] == 3 else [request(done.key, 5 + done.key, tuple(done.token_ids))]

        out = list(stream.submit([request(k, 2 + 9 * k) for k in range(6)], [k % 2 for k in range(6)], follow_up))
        assert sorted(c.key for c in out) == list(range(6)) and all(turns[k] == 3 for k in range(6))
        for e in engines:  # the calls queued behind the last sample (empty) have run
            e.thread.shutdown(wait=True)
        return [e.calls for e in engines], [e.finished_at for e in engines]

    calls, finished = run()
    for e, engine_calls in enumerate(calls):
        follow_ups = [
            prompt for call in engine_calls for _, prompt in call if prompt
        ]  # each holds what its engine sampled
        assert len(follow_ups) == 6 and all(set(prompt) == {e} for prompt in follow_ups)
        assert len(engine_calls) > QUEUED_CALLS
    for _ in range(3):  # whatever order the answers came back in
        assert run() == (calls, finished)


def test_an_engines_failure_is_raised_to_its_caller_and_to_later_callers():
    stream = EngineStream([[FakeEngine(0, fail_on_call=2)]], FakeWatch())
    with pytest.raises(RuntimeError, match="engine 0 died"):
        list(stream.submit([request(0, 80), request(1, 90)], [0, 0]))
    with pytest.raises(RuntimeError, match="engine 0 died"):
        stream.submit([request(2, 1)], [0])


def test_each_group_is_scored_while_the_engines_still_sample_the_others():
    engine = FakeEngine(0)
    stream = EngineStream([[engine]], FakeWatch())
    scored_when = []  # for each scored group: how many samples had ended by then

    def requests(prompts, n, temperature, seed_base, media):
        return [request(i * n + j, 2 + 30 * i + j) for i in range(len(prompts)) for j in range(n)]

    def score(rollouts, records, step):
        scored_when.append((rollouts[0].group, len(engine.finished_at)))
        for r in rollouts:
            r.reward = 1.0

    pg = object.__new__(PolicyGradient)
    pg.algorithm = SimpleNamespace(dynamic_sampling=False)
    pg.train = SimpleNamespace(batch_size=8, seed=0)
    pg.rollout = SimpleNamespace(n_samples=2, temperature=1.0, top_p=1.0)
    prompts = [SimpleNamespace(record={}, prompt_ids=[7], media=()) for _ in range(4)]
    pg.prompt_sets, pg.new_env, pg.policy_version = [prompts], None, 0
    pg.sampler = SimpleNamespace(next_batch=lambda count: [(0, i) for i in range(count)], state_dict=dict)
    pg.scoring, pg.drawing = threading.Lock(), threading.Lock()
    pool = SimpleNamespace(requests=requests, stream=lambda reqs, groups: stream.submit(reqs, [0] * len(reqs)))
    pg.run = SimpleNamespace(
        pool=pool,
        score=score,
        reward_fn=None,
        position=None,
        config=SimpleNamespace(reward=SimpleNamespace(overlong_buffer=0)),
    )
    from oxrl_core.loops.crash import timed

    batch = pg.sample(step=1, timer=timed)
    assert [g for g, _ in scored_when] == [0, 1, 2, 3]
    assert scored_when[0][1] < 8  # the first group was scored before the last sample ended
    assert [r.group for r in batch.rollouts] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert batch.seconds["reward"] > 0 and batch.seconds["generate"] > 0
