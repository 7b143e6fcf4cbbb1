"""The engines as one stream of samples: every caller's requests in, each sample out as soon as it finishes.

A thread of the driver keeps every engine busy (`RolloutEngine.advance`: a few scheduler steps a call, two calls
queued per engine, so an engine never waits for the driver) and hands each finished sample to its caller as soon
as its call returns: a caller scores a group the moment its last sample ends, while the engines go on with the
rest. A caller's `follow_up` (an episode's
next turn) runs on that thread and its requests go to the same engine in the next call, without waiting for any
other sample.

Reproducible: an engine's calls carry what the results of its earlier calls asked for, in order (call c + 2 the
follow-ups of call c's samples), and `advance` answers by its requests alone, so the same requests give the same
samples whatever the timing. Several callers at once (an asynchronous run's batches) share the engines; which
sample lands in which engine step then depends on timing.
"""

import itertools
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace

from oxrl_core.rollout.records import Completion, SampleRequest

QUEUED_CALLS = 2  # per engine: one running, one waiting, so the engine never idles on the driver's round trip

# A caller's continuation of a finished sample: the requests that follow it (an episode's next turn), or none if the
# sample is final. Keys are the caller's own.
FollowUp = Callable[[Completion], list[SampleRequest]]


class Sampling:
    """One caller's requests in the stream: iterate it for their final completions, as they finish (keys the
    caller's). An engine's failure or hang is raised here."""

    def __init__(self, count: int, follow_up: FollowUp | None):
        self.left, self.follow_up, self.done = count, follow_up, queue.Queue()

    def __iter__(self) -> Iterator[Completion]:
        while self.left:
            item = self.done.get()
            if isinstance(item, BaseException):
                raise item
            self.left -= 1
            yield item


class EngineStream:
    def __init__(self, engines: list[list], watch):
        """`engines`: each engine's workers (tensor-parallel rank 0 first, all given the same calls); `watch`: the
        run's ActorWatch, whose deadlines bound every call."""
        self.engines, self.watch = engines, watch
        self.keys = itertools.count()
        self.owner: dict[int, tuple[Sampling, int, int]] = {}  # engine key -> (its caller, the caller's key, engine)
        self.to_add: list[list[SampleRequest]] = [[] for _ in engines]  # each engine's requests for its next call
        self.calls: list[deque] = [deque() for _ in engines]  # each engine's calls in flight: their workers' refs
        self.open = [0] * len(engines)  # each engine's requests not yet finished
        self.changed = threading.Condition()
        self.failure: BaseException | None = None
        threading.Thread(target=self._run, name="engine-stream", daemon=True).start()

    def submit(self, requests: list[SampleRequest], engines: list[int], follow_up: FollowUp | None = None) -> Sampling:
        """Send each request to its engine (`engines`, one index each); the returned Sampling yields them finished."""
        sampling = Sampling(len(requests), follow_up)
        with self.changed:
            if self.failure is not None:
                raise self.failure
            for request, engine in zip(requests, engines):
                self._add(sampling, request, engine)
            self.changed.notify()
        return sampling

    def _add(self, sampling: Sampling, request: SampleRequest, engine: int) -> None:
        key = next(self.keys)
        self.owner[key] = (sampling, request.key, engine)
        self.to_add[engine].append(replace(request, key=key))
        self.open[engine] += 1

    def _run(self) -> None:
        try:
            while True:
                with self.changed:
                    for e, workers in enumerate(self.engines):
                        while (self.to_add[e] or self.open[e]) and len(self.calls[e]) < QUEUED_CALLS:
                            self.calls[e].append([w.advance.remote(self.to_add[e]) for w in workers])
                            self.to_add[e] = []
                    if not any(self.calls):
                        self.changed.wait()
                        continue
                heads = {calls[0][0]: e for e, calls in enumerate(self.calls) if calls}
                ref, finished = self.watch.first(list(heads), "sample")
                e = heads[ref]
                others = self.calls[e].popleft()[1:]  # the engine's other tensor-parallel workers: the same samples
                if others:
                    self.watch.get(others, "sample")
                with self.changed:
                    for completion in finished:
                        sampling, key, _ = self.owner.pop(completion.key)
                        self.open[e] -= 1
                        completion = replace(completion, key=key)
                        following = sampling.follow_up(completion) if sampling.follow_up else []
                        for request in following:
                            self._add(sampling, request, e)
                        if not following:
                            sampling.done.put(completion)
        except BaseException as e:  # every caller waiting now or later learns why
            with self.changed:
                self.failure = e
                for sampling in {s for s, _, _ in self.owner.values()}:
                    sampling.done.put(e)
