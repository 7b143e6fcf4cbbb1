"""Build locks of torch extensions. DeepSpeed compiles some of its ops on first use (CPU Adam, its CPU collectives)
through torch, which takes a lock file in the op's build folder for the build and waits, without end, while one
exists. A build killed half-way (a run stopped while it compiled) leaves its lock, and every later run would wait
on it until its hang deadline. A lock no process of this machine holds open, in a folder where nothing has changed
for STALE_AFTER_S, is taken to be such a leftover: `oxrl doctor` reports it, and a run stops on it, naming it,
before its cluster starts (the driver's machine) or as a rank starts (any other node)."""

import os
import time
from dataclasses import dataclass
from pathlib import Path

from oxrl_core.errors import OxrlError

STALE_AFTER_S = 45  # a build writes into its folder as it goes (ninja's log, each object file)
POLL_S = 1.0


@dataclass(frozen=True)
class BuildLock:
    path: Path
    idle_s: float  # since the lock or anything beside it last changed
    holders: tuple[int, ...]  # the processes of this machine that hold it open: the build that took it

    @property
    def stale(self) -> bool:
        return not self.holders and self.idle_s >= STALE_AFTER_S

    def describe(self) -> str:
        if self.holders:
            return f"{self.path}: a build in progress (process {', '.join(map(str, self.holders))})"
        return (
            f"{self.path}: a build lock left by an interrupted build ({_duration(self.idle_s)} old, held by no "
            f"process); every run that builds this op waits on it. Clear it: rm {self.path}"
        )


def extensions_root() -> Path:
    """Where torch builds extensions: $TORCH_EXTENSIONS_DIR, else its default root, one folder per Python and
    accelerator (`py311_cpu`) under it. Torch's own lookup (cpp_extension) would import torch's build tools, which
    warn on a machine without CUDA; its user cache folder is read through torch's copy of appdirs instead."""
    from torch._appdirs import user_cache_dir

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.realpath(user_cache_dir(appname="torch_extensions")))


def build_locks(root: Path | None = None) -> list[BuildLock]:
    """Every op's build lock under `root` (default: extensions_root())."""
    root = root or extensions_root()
    paths = sorted({*root.glob("*/lock"), *root.glob("*/*/lock")})
    if not paths:
        return []
    holders = _holders({os.path.realpath(path) for path in paths})
    now, locks = time.time(), []
    for path in paths:
        try:
            changed = path.stat().st_mtime
        except FileNotFoundError:  # released meanwhile
            continue
        changed = max([changed, *(_mtime(p) for p in path.parent.iterdir())])
        locks.append(BuildLock(path, now - changed, tuple(sorted(holders.get(os.path.realpath(path), ())))))
    return locks


def wait_for_builds(root: Path | None = None) -> None:
    """Return once no build lock is left under `root`, waiting while builds of this machine hold theirs; raise
    OxrlError naming a stale one (within STALE_AFTER_S of its build's end)."""
    while locks := build_locks(root):
        stale = [lock for lock in locks if lock.stale]
        if stale:
            raise OxrlError(stale[0].describe())
        time.sleep(POLL_S)


def _holders(paths: set[str]) -> dict[str, set[int]]:
    """Each of `paths` -> the processes of this machine that have it open (those this user may inspect)."""
    holders: dict[str, set[int]] = {}
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                if (target := os.readlink(fd)) in paths:
                    holders.setdefault(target, set()).add(int(fd_dir.parent.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return holders


def _mtime(path: Path) -> float:
    """When `path` last changed; 0 for a file a running build removed meanwhile (its temporary files)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _duration(seconds: float) -> str:
    return (
        f"{seconds / 3600:.1f} h"
        if seconds >= 3600
        else f"{seconds / 60:.0f} min"
        if seconds >= 60
        else f"{seconds:.0f} s"
    )
