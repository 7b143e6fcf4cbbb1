"""Rewards for the RL integration tests, imported by `module:function` (PYTHONPATH is this folder)."""

import os
import time


def digit_share(response: str, sample: dict) -> float:
    """Signal even from random weights: the share of digits in the response."""
    return sum(c.isdigit() for c in response) / max(len(response), 1)


def raises_on_odd_length(response: str, sample: dict) -> float:
    if len(response) % 2:
        raise ValueError(f"odd length {len(response)}")
    return 1.0


def nan(response: str, sample: dict) -> float:
    return float("nan")


def digit_share_pausing_once(response: str, sample: dict) -> float:
    """`digit_share`; with $PAUSE_FILE set, the run's first call creates that file and waits until the test, having
    signalled the run, removes it: the signal comes in step 1, at a known point. With $PAUSE_AFTER (a path) too, the
    first call once that path exists (e.g. the first checkpoint's ds/latest) pauses instead."""
    pause, after = os.environ.get("PAUSE_FILE"), os.environ.get("PAUSE_AFTER")
    if pause and (not after or os.path.exists(after)) and _first(pause + ".taken"):
        open(pause, "w").close()
        deadline = time.monotonic() + 120
        while os.path.exists(pause) and time.monotonic() < deadline:
            time.sleep(0.05)
    return digit_share(response, sample)


def _first(path: str) -> bool:
    """Whether this call created `path`: of the reward's calls on several threads at once, exactly one does."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
