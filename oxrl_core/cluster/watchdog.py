"""Every wait of the driver on a run's actors has a deadline; a wait past it is a hang, named and ended.

The rule (`Deadlines`): the first time a phase runs (start-up, compiling, allocating) it may take
FIRST_RUN_FACTOR x `run.hang_timeout_s`; later, LATER_FACTOR x the longest it took before, scaled up where it has
more work now (samples, micro-batches), and never less than `run.hang_timeout_s`. `run.hang_timeout_s: 0` turns
deadlines off (for debugging with breakpoints).

On a hang (`ActorWatch.get`): each actor that has not answered is named with its node, PID, process state and
innermost call; every actor of the run that still runs dumps its Python stacks (`faulthandler`, registered by
`dump_stacks_on_request` in each, so the dump comes even from a thread stuck in C++, e.g. inside a collective); the
stuck processes are killed (a stopped process ignores all but SIGKILL), and `Hang` carries the message and the
stacks to the loop's crash report.

Collectives get the first run's bound as their timeout (`collective_timeout`), so a peer that died inside one
becomes an error rather than a wait: the driver's deadline comes first for a live process that stopped answering.
"""

import datetime
import faulthandler
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from oxrl_core.errors import Hang

FIRST_RUN_FACTOR = 4
LATER_FACTOR = 5
OFF_COLLECTIVE_TIMEOUT = datetime.timedelta(days=1)  # deadlines off: a breakpoint may hold a rank for hours
STACK_SIGNAL = signal.SIGUSR1
_stack_files = []  # kept open for faulthandler's lifetime


@dataclass
class Deadlines:
    floor_s: float  # run.hang_timeout_s; 0: no deadlines
    slowest: dict[str, dict[int, float]] = field(default_factory=dict)  # phase -> units -> its longest seconds

    def bound(self, phase: str, units: int = 1) -> float | None:
        """Seconds the phase may take with `units` of work (None: no bound)."""
        if self.floor_s <= 0:
            return None
        if phase not in self.slowest:
            return FIRST_RUN_FACTOR * self.floor_s
        # more work than before scales the bound up; less never scales it down (generation is not linear in samples)
        longest = max(seconds * max(1.0, units / then) for then, seconds in self.slowest[phase].items())
        return max(self.floor_s, LATER_FACTOR * longest)

    def record(self, phase: str, units: int, seconds: float) -> None:
        runs = self.slowest.setdefault(phase, {})
        runs[units] = max(runs.get(units, 0.0), seconds)


def collective_timeout(hang_timeout_s: float) -> datetime.timedelta:
    """The timeout of the run's process groups (the trainer's, the weight channel's)."""
    if hang_timeout_s <= 0:
        return OFF_COLLECTIVE_TIMEOUT
    return datetime.timedelta(seconds=FIRST_RUN_FACTOR * hang_timeout_s)


def dump_stacks_on_request(log_path: Path) -> None:
    """In an actor's process: on STACK_SIGNAL, every thread's Python stack is appended to `<log>.stacks`."""
    stacks = open(log_path.with_suffix(".stacks"), "a")
    _stack_files.append(stacks)
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)


@dataclass
class _Watched:
    name: str  # e.g. rank1, engine0: its log's name
    log_path: Path
    where: ray.ObjectRef  # _where(): node, address, pid, GPUs, once the actor has started


class ActorWatch:
    def __init__(self, hang_timeout_s: float):
        self.hang_timeout_s = hang_timeout_s
        self.deadlines = Deadlines(hang_timeout_s)
        self._actors: dict = {}  # actor id -> _Watched

    def add(self, actor, name: str, log_path: Path):
        """Watch `actor` (named as its log, `log_path`); returns it."""
        self._actors[actor._actor_id] = _Watched(name, log_path, actor.__ray_call__.remote(_where))
        return actor

    def where(self, actor) -> ray.ObjectRef:
        return self._actors[actor._actor_id].where

    def get(self, refs: list, phase: str, units: int = 1) -> list:
        """`ray.get(refs)` within the phase's deadline. An actor's error is raised as soon as it arrives (a peer of
        a dead rank may wait in a collective forever); past the deadline, `Hang`."""
        start, pending, values = time.monotonic(), list(refs), {}
        while pending:
            ref, values[ref] = self._next(pending, phase, units, start)
            pending.remove(ref)
        self.deadlines.record(phase, units, time.monotonic() - start)
        return [values[ref] for ref in refs]

    def first(self, refs: list, phase: str) -> tuple:
        """The first of `refs` to be ready and its value, as `get` waits for each."""
        start = time.monotonic()
        ref, value = self._next(refs, phase, 1, start)
        self.deadlines.record(phase, 1, time.monotonic() - start)
        return ref, value

    def _next(self, pending: list, phase: str, units: int, start: float) -> tuple:
        bound = self.deadlines.bound(phase, units)
        left = None if bound is None else bound - (time.monotonic() - start)
        ready = ray.wait(pending, num_returns=1, timeout=None if left is None else max(left, 0))[0]
        if not ready:
            raise self._hang(pending, phase, time.monotonic() - start, bound)
        try:
            return ready[0], ray.get(ready[0])
        except ray.exceptions.RayError as e:  # the actor's error, or its death: named for the crash report
            watched = self._actors.get(ready[0].task_id().actor_id())
            if watched is not None:
                e.actor = watched.name
                e.add_note(f"in {watched.name} (its log: {watched.log_path})")
            raise

    def _hang(self, pending: list, phase: str, waited: float, bound: float) -> Hang:
        stuck = {ref.task_id().actor_id() for ref in pending}
        # every actor's stacks, in parallel; the stuck are killed after theirs, the others end as at any exit
        found = dict(zip(self._actors, self._inspect([(w, actor_id in stuck) for actor_id, w in self._actors.items()])))
        rule = (
            f"{FIRST_RUN_FACTOR} x run.hang_timeout_s={self.hang_timeout_s:g} on its first run"
            if phase not in self.deadlines.slowest
            else f"{LATER_FACTOR} x its longest earlier run, at least run.hang_timeout_s={self.hang_timeout_s:g}"
        )
        who = "; ".join(found[actor_id][0] for actor_id in self._actors if actor_id in stuck)
        message = f"hang: {phase} gave no answer in {waited:.0f} s (its deadline: {bound:.0f} s, {rule}): {who}"
        report = (
            message
            + "\n\n"
            + "\n\n".join(
                f"=== {line}{' -- stuck' if actor_id in stuck else ''}\n{stacks}"
                for actor_id, (line, stacks) in found.items()
            )
        )
        return Hang(message, report)

    def _inspect(self, actors: list[tuple[_Watched, bool]]) -> list[tuple[str, str]]:
        """For each (actor, kill): one line on it and its stacks; its process is killed after if `kill`."""
        asked = []
        for watched, kill in actors:
            ready, _ = ray.wait([watched.where], timeout=1)
            try:
                where = ray.get(ready[0]) if ready else None
            except ray.exceptions.RayError:  # it died starting
                where = None
            if where is None:
                asked.append((watched, None, None))
                continue
            node = NodeAffinitySchedulingStrategy(where["node_id"], soft=False)
            asked.append(
                (
                    watched,
                    where,
                    _stacks_of.options(scheduling_strategy=node).remote(
                        where["pid"], str(watched.log_path.with_suffix(".stacks")), kill
                    ),
                )
            )
        found = []
        for watched, where, answer in asked:
            if where is None:
                found.append(
                    (
                        f"{watched.name} (never started: its process unknown)",
                        "(no stacks: the actor never finished starting)",
                    )
                )
                continue
            try:
                state, stacks = ray.get(answer, timeout=30)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as e:
                state, stacks = "unknown", f"(no stacks: {type(e).__name__})"
            doing = innermost_call(stacks)
            found.append(
                (
                    f"{watched.name} (pid {where['pid']} on {where['address']}, {state}"
                    f"{', in ' + doing if doing else ''})",
                    stacks,
                )
            )
        return found


def innermost_call(stacks: str) -> str:
    """`function (file:line)` of the main thread's innermost Python frame in a faulthandler dump ('' if none). The
    dump lists threads newest first (the signal may land on any of them): the main thread, the oldest, is last."""
    innermost = ""
    lines = stacks.splitlines()
    for header, frame in zip(lines, lines[1:]):
        if "thread 0x" in header.lower() and frame.strip().startswith('File "'):
            path, rest = frame.strip().removeprefix('File "').split('", line ', 1)
            number, function = rest.split(" in ", 1)
            innermost = f"{function} ({Path(path).name}:{number})"
    return innermost


@ray.remote(num_cpus=0)
def _stacks_of(pid: int, stacks_path: str, kill: bool) -> tuple[str, str]:
    """On the actor's node: its process state and, unless it is stopped, its stacks; then SIGKILL if `kill`."""
    import psutil

    try:
        state = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone", "(no stacks: the process is gone)"
    path = Path(stacks_path)
    before = path.stat().st_size if path.exists() else 0
    stacks = "(no stacks: a stopped process cannot answer)"
    if state != psutil.STATUS_STOPPED:
        os.kill(pid, STACK_SIGNAL)
        deadline, size = time.monotonic() + 5, before
        while time.monotonic() < deadline:
            time.sleep(0.5)
            grown = path.stat().st_size if path.exists() else 0
            if grown > before and grown == size:  # written, and no longer growing
                break
            size = grown
        try:
            with open(path) as f:
                f.seek(before)
                stacks = f.read() or "(no stacks: the process did not answer the signal)"
        except FileNotFoundError:
            stacks = "(no stacks: the process did not answer the signal)"
    if kill:
        os.kill(pid, signal.SIGKILL)
    return state, stacks


def _where(_actor) -> dict:
    context = ray.get_runtime_context()
    return {
        "node_id": context.get_node_id(),
        "address": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
        "gpus": [str(g) for g in ray.get_gpu_ids()],
    }
