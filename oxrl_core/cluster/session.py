"""A run's Ray cluster: `start_ray` starts or joins one; `ray_cluster` also decides the run's placement on its GPUs,
reserves the placement groups and, at the end, shuts down what it started."""

import logging
import os
import signal
import threading
from contextlib import contextmanager, suppress

import psutil
import ray

from oxrl_core.cluster.bundles import Reservation
from oxrl_core.cluster.placement import PlacementRequest, decide, local_gpus
from oxrl_core.cluster.shield import shielded_children
from oxrl_core.cluster.watchdog import ActorWatch

SHUTDOWN_GRACE_S = 10  # for the cluster's killed processes to be reaped


def start_ray(num_cpus: int | None = None) -> None:
    """Join `RAY_ADDRESS` when set, else start a private cluster on this machine of `num_cpus` CPU slots (default:
    its cores). Slots are scheduling units: more processes than cores share them, as they would without Ray. The
    cluster's processes start shielded from SIGTERM (cluster/shield.py): a signal to the whole job stops the driver
    alone, which saves before it shuts them down."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with signals_held(), shielded_children():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, logging_level=logging.WARNING)
        else:
            # "local": a cluster of its own, never the latest one `ray start` left on this machine (ray.init's default)
            ray.init(
                address="local",
                num_cpus=num_cpus or os.cpu_count(),
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                object_store_memory=256 * 1024**2,
            )


@contextmanager
def signals_held():
    """SIGINT and SIGTERM wait until the block is done, then go to the handlers from before it. ray.init stopped
    half-way leaves processes behind that ray.shutdown does not know of, and it takes SIGTERM for itself (a handler
    that exits at once, and its C++ logging's that aborts) where a training run's handler checkpoints first."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread has signal handlers
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    arrived = []
    for s in previous:
        signal.signal(s, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for s in arrived[:1]:
        signal.raise_signal(s)


@contextmanager
def ray_cluster(request: PlacementRequest | None, hang_timeout_s: float):
    """`start_ray`; with a request, decide its placement on that cluster's GPUs (this machine's, or once
    `RAY_ADDRESS` is joined, the cluster's) and reserve its placement groups, yielding the `Reservation`, whose
    actors are watched with the deadlines of `hang_timeout_s` (None without a request). Shuts down what it started."""
    placement = None
    if request is not None and not os.environ.get("RAY_ADDRESS"):
        placement = decide(request, local_gpus())
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    try:
        start_ray(max(os.cpu_count() or 1, placement.bundles) if placement else None)
        if request is not None and placement is None:
            placement = decide(request, int(ray.cluster_resources().get("GPU", 0)))
        yield Reservation(placement, ActorWatch(hang_timeout_s)) if placement else None
    finally:
        # A cluster of its own: its processes (Ray's, the actors', their engines' workers) are this one's descendants,
        # all started with SIGTERM blocked. ray.shutdown would send each of Ray's five daemons SIGTERM and wait its
        # second for it to exit before its SIGKILL, and the actors exit once their raylet is gone: 5 s a run. With
        # the node forgotten, ray.shutdown only disconnects, and the cluster is killed at once; nothing in it has
        # anything left to save (the ranks have saved and shut down).
        spawned = [child for child in psutil.Process().children(recursive=True) if child.pid not in before]
        node, ray._private.worker._global_node = ray._private.worker._global_node, None
        ray.shutdown()
        if node is not None and node.is_head():
            node.destroy_external_storage()
        for process in spawned:
            with suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(spawned, timeout=SHUTDOWN_GRACE_S)
