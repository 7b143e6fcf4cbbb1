"""Torch-extension build locks (training/build_locks.py): a build's lock is waited on, a dead one is named."""

import os
import threading
import time

import pytest

from oxrl_core.doctor.system import build_locks_check
from oxrl_core.errors import OxrlError
from oxrl_core.training.build_locks import STALE_AFTER_S, build_locks, wait_for_builds


def lock_in(root, name: str = "cpu_adam", age_s: float = 0.0):
    """`root/py311_cpu/<name>/lock` as torch's FileBaton leaves it (empty), last changed `age_s` ago."""
    lock = root / "py311_cpu" / name / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    for path in (lock, lock.parent / "build.ninja"):
        path.touch()
        os.utime(path, (time.time() - age_s,) * 2)
    return lock


def test_a_lock_no_process_holds_in_an_idle_folder_is_stale_and_says_how_to_clear_it(tmp_path):
    lock = lock_in(tmp_path, age_s=3 * 3600)
    [found] = build_locks(tmp_path)
    assert found.stale and found.holders == ()
    assert found.describe() == (
        f"{lock}: a build lock left by an interrupted build (3.0 h old, held by no process); "
        f"every run that builds this op waits on it. Clear it: rm {lock}"
    )
    with pytest.raises(OxrlError, match=f"{lock}: a build lock left by an interrupted build"):
        wait_for_builds(tmp_path)


def test_a_lock_a_build_holds_open_or_one_just_left_is_not_stale(tmp_path):
    held = lock_in(tmp_path, "held", age_s=3 * 3600)
    fd = os.open(held, os.O_RDONLY)  # as the building process holds it
    try:
        lock_in(tmp_path, "young", age_s=STALE_AFTER_S / 2)
        locks = {lock.path.parent.name: lock for lock in build_locks(tmp_path)}
        assert locks["held"].holders == (os.getpid(),) and not locks["held"].stale
        assert "a build in progress (process" in locks["held"].describe()
        assert locks["young"].holders == () and not locks["young"].stale
    finally:
        os.close(fd)


def test_waiting_ends_when_the_build_releases_its_lock(tmp_path):
    lock = lock_in(tmp_path)
    fd = os.open(lock, os.O_RDONLY)

    def release():
        time.sleep(1.5)
        os.close(fd)
        lock.unlink()

    releaser = threading.Thread(target=release)
    releaser.start()
    start = time.monotonic()
    wait_for_builds(tmp_path)
    releaser.join()
    assert 1.0 < time.monotonic() - start < 10 and build_locks(tmp_path) == []
    wait_for_builds(tmp_path / "no-builds-yet")  # no extensions folder at all: nothing to wait for


def test_the_doctor_warns_of_a_stale_lock_with_the_command_that_clears_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert build_locks_check().status == "ok" and str(tmp_path) in build_locks_check().finding
    lock = lock_in(tmp_path, age_s=600)
    check = build_locks_check()
    assert check.status == "warn" and "10 min old" in check.finding and check.fix == f"rm {lock}"


def test_the_extensions_root_is_torchs(monkeypatch):
    from torch.utils.cpp_extension import get_default_build_root

    from oxrl_core.training.build_locks import extensions_root

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert str(extensions_root()) == get_default_build_root()
