"""Stopping a run on SIGTERM (what SLURM and Kubernetes send before they kill) and SIGINT (Ctrl-C).

During start-up a signal stops at once: nothing is trained yet that a checkpoint could keep. Once the steps run,
the first signal lets the current step finish; the loop then writes a checkpoint and raises `Stopped`. A Ctrl-C
after it raises at once; SIGTERM again changes nothing (schedulers send it more than once, and their SIGKILL ends a
run that overstays). On the way out the loops' context managers shut DeepSpeed, vLLM and Ray down.
"""

import signal
import threading
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """The run stopped on a signal. A BaseException, as KeyboardInterrupt is: no `except Exception` swallows it."""

    def __init__(self, signum: int, message: str, run_dir: Path):
        super().__init__(message)
        self.exit_code = 128 + signum  # the shell's code for death by that signal: 143 SIGTERM, 130 SIGINT
        self.resumable = (run_dir / "ds" / "latest").is_file()


class StopSignals:
    """`received`: the first signal's number once one came. The loop sets `steps_running` when its steps begin."""

    def __init__(self, run_dir: Path, console: Console):
        self.run_dir, self.console = run_dir, console
        self.received: int | None = None
        self.steps_running = False
        self.stopped_by = ""  # what stopped the run at once, for the message

    def handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.steps_running and self.received == signum == signal.SIGTERM:
            return  # sent again: Slurm signals a job's processes more than once, and a job script may pass it on too
        if not self.steps_running or self.received is not None:
            self.received = signum
            self.stopped_by = (
                f"stopped by {name} during start-up"
                if not self.steps_running
                else f"aborted by a second {name} in the middle of a step"
            )
            # KeyboardInterrupt, not Stopped: Ray's waits (ray.get) pass on only that one from a signal handler
            raise KeyboardInterrupt
        self.received = signum
        self.console.print(
            f"{name}: finishing this step, then a checkpoint and exit (Ctrl-C again aborts at once)",
            highlight=False,
            soft_wrap=True,
        )

    def stop(self, step: int) -> "Stopped":
        """What the loop raises after the checkpoint of `step`."""
        return Stopped(
            self.received, f"stopped by {signal.Signals(self.received).name} after step {step}", self.run_dir
        )


@contextmanager
def stop_on_signals(run_dir: Path, console: Console):
    """Handle SIGTERM and SIGINT as above while the block runs; Python lets only the main thread set handlers, so
    elsewhere (a run started from a thread through the API) the signals keep their handlers."""
    signals = StopSignals(run_dir, console)
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    previous = {s: signal.signal(s, signals.handle) for s in SIGNALS}
    try:
        yield signals
    except KeyboardInterrupt:
        if not signals.stopped_by:
            raise
        raise Stopped(signals.received, signals.stopped_by, run_dir) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
