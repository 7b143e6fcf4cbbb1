"""Placement on real Ray clusters: GPUs declared to Ray (no CUDA needed to place), and two Ray nodes on this machine
joined through RAY_ADDRESS as a user's cluster would be."""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from oxrl_core.cluster.bundles import Reservation
from oxrl_core.cluster.placement import Placement
from oxrl_core.cluster.watchdog import ActorWatch
from oxrl_core.errors import OxrlError

pytestmark = pytest.mark.integration


@pytest.fixture
def two_declared_gpus():
    """A private cluster whose two GPUs exist for Ray's scheduler only: where actors land is what is tested."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def gpus_of(reservation: Reservation, ranks: int, engines: list[int]) -> tuple[list, list]:
    """The GPUs Ray gives an actor placed as each rank and each engine worker would be, each as "node:GPU"."""

    class Probe:  # defined here so that Ray ships it by value (this test module is not importable on its workers)
        def gpus(self) -> list[str]:
            return [f"{ray.get_runtime_context().get_node_id()}:{g}" for g in ray.get_gpu_ids()]

    probe = ray.remote(Probe)
    rank_gpus = ray.get([probe.options(**reservation.rank_options(r)).remote().gpus.remote() for r in range(ranks)])
    worker_gpus = [
        ray.get([probe.options(**reservation.engine_worker_options(e, s)).remote().gpus.remote() for s in range(tp)])
        for e, tp in enumerate(engines)
    ]
    return rank_gpus, worker_gpus


@pytest.mark.own_ray_cluster
def test_colocated_ranks_get_a_gpu_each_and_each_engine_worker_joins_one(two_declared_gpus):
    """The layout that crashed with NCCL's "Duplicate GPU detected": 2 ranks + 2 engines on 2 GPUs."""
    ranks, workers = gpus_of(Reservation(Placement("colocated", True, 2, 2, 1), ActorWatch(0)), 2, [1, 1])
    assert all(len(g) == 1 for g in ranks) and ranks[0] != ranks[1]
    assert [w[0] for w in workers] == ranks  # engine i on rank i's GPU


@pytest.mark.own_ray_cluster
def test_a_tensor_parallel_engine_spans_the_ranks_gpus(two_declared_gpus):
    ranks, workers = gpus_of(Reservation(Placement("colocated", True, 2, 1, 2), ActorWatch(0)), 2, [2])
    assert ranks[0] != ranks[1] and workers == [ranks]


@pytest.mark.own_ray_cluster
def test_split_gives_the_engine_a_gpu_of_its_own(two_declared_gpus):
    ranks, workers = gpus_of(Reservation(Placement("split", True, 1, 1, 1), ActorWatch(0)), 1, [1])
    assert ranks[0] != workers[0][0]


@pytest.mark.own_ray_cluster
def test_ranks_slower_to_build_than_the_placement_timeout_are_recorded_within_the_hang_deadline(
    two_declared_gpus, tmp_path, monkeypatch
):
    """A rank that takes minutes to build (DeepSpeed's CPU Adam under offload on a loaded machine) failed the run
    with Ray's bare GetTimeoutError once the fixed placement timeout ran out; the run's hang deadline applies."""
    import oxrl_core.cluster.bundles as bundles

    monkeypatch.setattr(bundles, "PLACEMENT_TIMEOUT_S", 1)

    class SlowRank:
        def __init__(self):
            import time

            time.sleep(4)

    reservation = Reservation(Placement("colocated", True, 2, 0, 1), ActorWatch(60))
    ranks = [
        reservation.watch.add(
            ray.remote(SlowRank).options(**reservation.rank_options(r)).remote(), f"rank{r}", tmp_path / f"rank{r}.log"
        )
        for r in range(2)
    ]
    reservation.record(tmp_path, ranks, [])
    placed = json.loads((tmp_path / "placement.json").read_text())
    assert len(placed["ranks"]) == 2 and placed["ranks"][0]["gpus"] != placed["ranks"][1]["gpus"]


def two_nodes_of_declared_gpus(gpus: int):
    """Two Ray nodes of this machine with `gpus` GPUs each, declared to Ray's scheduler only: two hosts of a cluster."""
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 2 * gpus, "num_gpus": gpus, "object_store_memory": 100 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def two_nodes_of_four_declared_gpus():
    yield from two_nodes_of_declared_gpus(4)


@pytest.mark.own_ray_cluster
def test_eight_colocated_ranks_on_two_nodes_get_a_gpu_each_and_each_tensor_parallel_engine_stays_on_one_node(
    two_nodes_of_four_declared_gpus,
):
    """Issue 19's layout: 8 ranks, 4 engines of tensor parallelism 2, each engine worker on its rank's GPU."""
    ranks, workers = gpus_of(Reservation(Placement("colocated", True, 8, 4, 2), ActorWatch(0)), 8, [2, 2, 2, 2])
    assert all(len(g) == 1 for g in ranks) and len({g[0] for g in ranks}) == 8
    assert [[w[0] for w in engine] for engine in workers] == [[ranks[2 * e][0], ranks[2 * e + 1][0]] for e in range(4)]
    assert all(len({w[0].split(":")[0] for w in engine}) == 1 for engine in workers)


@pytest.mark.own_ray_cluster
def test_split_six_ranks_and_two_engines_on_two_nodes_use_each_of_the_eight_gpus_once(two_nodes_of_four_declared_gpus):
    ranks, workers = gpus_of(Reservation(Placement("split", True, 6, 2, 1), ActorWatch(0)), 6, [1, 1])
    assert len({g[0] for g in ranks} | {w[0][0] for w in workers}) == 8


@pytest.fixture
def two_nodes_of_three_declared_gpus():
    yield from two_nodes_of_declared_gpus(3)


@pytest.mark.own_ray_cluster
def test_a_colocated_tensor_parallel_engine_that_would_span_two_nodes_is_refused_by_name(
    two_nodes_of_three_declared_gpus,
):
    """6 ranks on two 3-GPU nodes, engines of tensor parallelism 2: engine 1's workers would sit on ranks 2 and 3, one
    on each node. Refused before any actor starts, with the way out; the reservation is given back."""
    with pytest.raises(
        OxrlError, match=r"engine 1's 2 tensor-parallel workers would sit on the GPUs of trainer ranks 2-3"
    ):
        Reservation(Placement("colocated", True, 6, 3, 2), ActorWatch(0))
    assert ray.util.placement_group_table() == {} or all(
        g["state"] == "REMOVED" for g in ray.util.placement_group_table().values()
    )


@pytest.fixture(scope="module")
def two_node_cluster():
    """Two Ray nodes on this machine (each its own raylet and object store), 2 CPU slots each; its tests leave
    nothing placed on it, so they share it."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 100 * 2**20})
    cluster.add_node(num_cpus=2, object_store_memory=100 * 2**20)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.mark.own_ray_cluster
def test_two_rl_steps_with_the_trainer_on_one_node_and_the_engines_on_another(
    tmp_path, tiny_model_dir, oxrl, two_node_cluster
):
    """Split, 2 ranks + an engine of tensor parallelism 2: each node has room for one side only, so the weights cross
    nodes (gloo) to both of the engine's workers, which meet on their own node."""
    result = oxrl(
        "train",
        "rl",
        "--alg",
        "cispo",
        "--config",
        "examples/cispo_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        "data.val=null",
        f"run.output_dir={tmp_path}",
        "run.name=two-nodes",
        "train.steps=2",
        "train.batch_size=16",
        "train.micro_batch_size=4",
        "train.grad_accum=2",
        "rollout.n_samples=4",
        "rollout.engines=1",
        "rollout.tensor_parallel_size=2",
        "rollout.placement=split",
        "reward.func=rl_test_rewards:digit_share",
        env={"RAY_ADDRESS": two_node_cluster.address, "PYTHONPATH": str(Path(__file__).resolve().parent)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "placement: split: 2 trainer CPU slot(s) + 2 engine CPU slot(s)" in result.stdout
    where = json.loads((tmp_path / "two-nodes" / "placement.json").read_text())
    trainer_nodes = {r["node_id"] for r in where["ranks"]}
    engine_nodes = {w["node_id"] for e in where["engines"] for w in e}
    assert len(trainer_nodes) == 1 and len(engine_nodes) == 1 and trainer_nodes != engine_nodes
    assert [len(workers) for workers in where["engines"]] == [2]
    steps = json.loads((tmp_path / "two-nodes" / "summary.json").read_text())["history"]
    assert [h["policy_version"] for h in steps] == [1, 2] and steps[0]["grad_norm"] > 0  # it trained: the weights moved
    assert steps[1]["logprob_gap_abs"] < 1e-3  # step 2 sampled from both workers, refreshed across nodes


@pytest.mark.own_ray_cluster
def test_without_ray_address_a_run_starts_a_cluster_of_its_own_beside_one_that_ray_start_left(
    two_node_cluster, monkeypatch
):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    script = (
        "import ray; from oxrl_core.cluster.session import start_ray; start_ray(2); "
        "print('ADDRESS', ray.get_runtime_context().gcs_address); ray.shutdown()"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("ADDRESS ")[1].strip() != two_node_cluster.address


@pytest.mark.own_ray_cluster
def test_the_doctor_compares_the_nodes_versions(two_node_cluster, monkeypatch):
    from oxrl_core.doctor import probes

    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster.address)
    check = probes.ray_check(probes.Probe("ray_start", [], timeout=120).result())
    assert check.status == "ok" and "2 node(s) with the same versions" in check.finding, check.finding


@pytest.mark.own_ray_cluster  # the cluster `ray_cluster` starts itself: everything it spawned must end with it
def test_a_process_of_the_runs_cluster_that_ignores_the_shutdown_is_killed_before_ray_cluster_returns(monkeypatch):
    """A process of the run that Ray's shutdown misses (as an engine's did once after a Ctrl-C, which reaches every
    process): here an actor's child that ignores SIGTERM and SIGINT, with Ray's own killing of actors' children off."""
    import psutil

    from oxrl_core.cluster import session
    from oxrl_core.cluster.session import ray_cluster

    monkeypatch.setattr(session, "SHUTDOWN_GRACE_S", 2)  # the stray never exits: no need to wait out the default
    monkeypatch.setenv("RAY_kill_child_processes_on_worker_exit", "0")
    monkeypatch.setenv("RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper", "0")

    @ray.remote
    class Engine:
        def start_worker(self) -> int:
            ignore = "import signal, time; [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT)]; time.sleep(600)"
            return subprocess.Popen([sys.executable, "-c", ignore], start_new_session=True).pid

    with ray_cluster(None, 0):
        worker = ray.get(Engine.remote().start_worker.remote())
        assert psutil.Process(worker).status() != psutil.STATUS_ZOMBIE
    with contextlib.suppress(psutil.NoSuchProcess):
        assert psutil.Process(worker).status() == psutil.STATUS_ZOMBIE  # killed, its parent gone, not yet reaped
