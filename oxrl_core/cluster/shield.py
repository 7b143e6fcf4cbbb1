"""Signals to a whole job reach the driver alone.

Schedulers do not signal one process: at preemption or its time limit Slurm sends SIGTERM to every process of the
job, `timeout` to its whole process group. Ray's own processes (its daemons, the trainer ranks' and engines'
workers) would die at once, and the driver could not save the step it was finishing. A process started with
SIGTERM blocked keeps it pending instead, and so do all it starts in turn (the mask is inherited through fork and
exec); the driver, which alone handles SIGTERM (loops/signals.py), saves and then ends them: a cluster it started
is killed (cluster/session.py), and a scheduler's SIGKILL after its grace period ends them in any case.
Ray blocks SIGINT in its processes itself, for Ctrl-C, which reaches the whole foreground process group.

    python -m oxrl_core.cluster.shield ray start --head --block   # a Ray node started by a job script
"""

import os
import signal
import sys
from contextlib import contextmanager

SHIELDED = {signal.SIGTERM}


@contextmanager
def shielded_children():
    """Processes started by this thread within the block begin with SIGTERM blocked (this one only until the block
    ends: a SIGTERM that came meanwhile is delivered then)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SHIELDED)


def main(command: list[str]) -> None:
    """Become `command` with SIGTERM blocked."""
    if not command:
        sys.exit("usage: python -m oxrl_core.cluster.shield COMMAND [ARGS...]")
    signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        sys.exit(f"oxrl_core.cluster.shield: cannot run {command[0]}: {e.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
