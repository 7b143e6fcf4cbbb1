"""The mixed-ratio sampler: epochs, ratios, and restoring from its state."""

import json
from collections import Counter

import pytest

from oxrl_core.data.sampler import MixedSampler
from oxrl_core.errors import OxrlError


def test_single_source_visits_every_example_once_per_epoch():
    sampler = MixedSampler([10], [1.0], seed=3)
    first = [i for _, i in sampler.next_batch(5) + sampler.next_batch(5)]
    second = [i for _, i in sampler.next_batch(10)]
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second  # a new permutation each epoch


def test_restored_sampler_continues_with_the_same_batches():
    original = MixedSampler([7, 13], [1.0, 3.0], seed=0)
    for _ in range(5):
        original.next_batch(4)
    restored = MixedSampler([7, 13], [1.0, 3.0], seed=0)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert [original.next_batch(4) for _ in range(10)] == [restored.next_batch(4) for _ in range(10)]


def test_ratios_set_the_share_of_each_source():
    sampler = MixedSampler([50, 50], [1.0, 3.0], seed=1)
    counts = Counter(source for _ in range(500) for source, _ in sampler.next_batch(8))
    assert abs(counts[1] / 4000 - 0.75) < 0.03


def test_same_seed_same_order_other_seed_other_order():
    def order(seed):
        return MixedSampler([20, 5], [1.0, 1.0], seed).next_batch(16)

    assert order(0) == order(0) and order(0) != order(1)


def test_state_survives_json_and_refuses_another_number_of_sources():
    sampler = MixedSampler([4, 6], [1.0, 1.0], seed=2)
    sampler.next_batch(7)
    state = json.loads(json.dumps(sampler.state_dict()))
    with pytest.raises(OxrlError, match="sampled 2 sources, this config has 3"):
        MixedSampler([4, 6, 5], [1.0, 1.0, 1.0], seed=2).load_state_dict(state)
