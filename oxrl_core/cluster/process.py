"""Setting up one of the run's processes (a trainer rank's, an engine's): where its output goes, and its stacks on
the driver's request."""

import os
import sys
from pathlib import Path

from oxrl_core.cluster.watchdog import dump_stacks_on_request


def redirect_output(path: Path) -> None:
    """Send this process's stdout/stderr (DeepSpeed is chatty) to a per-rank log in the run folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    dump_stacks_on_request(path)  # an actor's process: the driver asks for its stacks when it hangs
