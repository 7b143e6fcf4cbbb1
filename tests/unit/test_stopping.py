"""Stopping on signals (loops/signals.py), signals held while Ray starts, the cluster shielded from a job-wide
SIGTERM (cluster/shield.py), and checkpoints complete or absent (loops/run_folder.py)."""

import errno
import shutil
import signal
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest
from rich.console import Console

from oxrl_core.cluster.session import signals_held
from oxrl_core.cluster.shield import shielded_children
from oxrl_core.errors import OxrlError
from oxrl_core.loops.run_folder import resume_state, save_checkpoint
from oxrl_core.loops.signals import Stopped, stop_on_signals


def test_the_first_signal_during_the_steps_only_asks_the_loop_to_stop_after_its_step(tmp_path):
    with stop_on_signals(tmp_path, Console(file=open(tmp_path / "out", "w"))) as signals:
        signals.steps_running = True
        signal.raise_signal(signal.SIGTERM)  # no exception: the step goes on
        assert signals.received == signal.SIGTERM
        stopped = signals.stop(3)
    assert str(stopped) == "stopped by SIGTERM after step 3" and stopped.exit_code == 143
    assert "finishing this step, then a checkpoint" in (tmp_path / "out").read_text()


def test_sigterm_again_changes_nothing_as_schedulers_send_it_more_than_once(tmp_path):
    with stop_on_signals(tmp_path, Console(quiet=True)) as signals:
        signals.steps_running = True
        for _ in range(3):
            signal.raise_signal(signal.SIGTERM)
        assert signals.received == signal.SIGTERM and not signals.stopped_by


def test_a_second_signal_aborts_at_once(tmp_path):
    with pytest.raises(Stopped, match="aborted by a second SIGINT") as stopped:
        with stop_on_signals(tmp_path, Console(quiet=True)) as signals:
            signals.steps_running = True
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            pytest.fail("the second signal did not stop the block")
    assert stopped.value.exit_code == 130


def test_a_signal_during_start_up_stops_at_once_and_knows_whether_a_checkpoint_exists(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "latest").write_text("step-4")  # a resumed run stopped while starting again
    with pytest.raises(Stopped, match="stopped by SIGTERM during start-up") as stopped:
        with stop_on_signals(tmp_path, Console(quiet=True)):
            signal.raise_signal(signal.SIGTERM)
            pytest.fail("the signal did not stop the start-up")
    assert stopped.value.exit_code == 143 and stopped.value.resumable


def test_the_handlers_from_before_come_back_and_a_plain_ctrl_c_stays_a_keyboard_interrupt(tmp_path):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with pytest.raises(KeyboardInterrupt):
        with stop_on_signals(tmp_path, Console(quiet=True)):
            raise KeyboardInterrupt  # not from a signal: passed on as it is
    assert {s: signal.getsignal(s) for s in before} == before


def test_signals_while_ray_starts_wait_for_it_then_reach_the_earlier_handler_once():
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        with signals_held():
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
            assert received == []
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


class FakeGroup:
    """The two calls a checkpoint makes on the ranks, writing what they would; `fail` raises in one of them."""

    def __init__(self, fail: tuple[str, BaseException] | None = None):
        self.fail = fail

    def call(self, method, **kwargs) -> list:
        method = method.__name__  # a method of TrainEngine, as TrainGroup.call takes it
        if self.fail and self.fail[0] == method:
            (kwargs.get("out_dir") or kwargs["ds_dir"] / kwargs["tag"]).mkdir(parents=True, exist_ok=True)
            raise self.fail[1]
        if method == "save_checkpoint":
            (kwargs["ds_dir"] / kwargs["tag"]).mkdir(parents=True, exist_ok=True)
            (kwargs["ds_dir"] / kwargs["tag"] / "model_states.pt").write_bytes(b"x")
        else:
            kwargs["out_dir"].mkdir(parents=True, exist_ok=True)
            (kwargs["out_dir"] / "model.safetensors").write_bytes(b"x")
        return [None]


def test_a_checkpoint_is_named_by_latest_only_once_complete(tmp_path):
    assert save_checkpoint(FakeGroup(), tmp_path, 2, False, {"sampler": {}}, "tok") == tmp_path / "checkpoint-000002"
    assert (tmp_path / "ds" / "latest").read_text() == "step-2"
    assert save_checkpoint(FakeGroup(), tmp_path, 4, True, {"sampler": {}}, "tok") == tmp_path / "final"
    assert (tmp_path / "ds" / "latest").read_text() == "step-4"
    assert '"step": 4' in (tmp_path / "ds" / "step-4" / "oxrl_state.json").read_text()


@pytest.mark.parametrize(
    "method, error",
    [
        ("save_hf", OSError(errno.ENOSPC, "No space left on device")),
        ("save_checkpoint", RuntimeError("SafetensorError: I/O error: No space left on device (os error 28)")),
    ],
    ids=["oserror", "in-a-message"],
)
def test_a_full_disk_removes_the_partial_checkpoint_and_keeps_the_last_one(tmp_path, method, error):
    save_checkpoint(FakeGroup(), tmp_path, 1, False, {}, "tok")
    with pytest.raises(
        OxrlError,
        match=r"checkpoint of step 2: no space left .* the last complete checkpoint "
        r"\(step-1\) is intact: free space and rerun with --resume",
    ):
        save_checkpoint(FakeGroup((method, error)), tmp_path, 2, False, {}, "tok")
    assert (tmp_path / "ds" / "latest").read_text() == "step-1"
    assert not (tmp_path / "ds" / "step-2").exists() and not (tmp_path / "checkpoint-000002").exists()
    assert (tmp_path / "ds" / "step-1" / "model_states.pt").is_file() and (tmp_path / "checkpoint-000001").is_dir()


def test_torch_s_bare_write_error_counts_as_a_full_disk_only_when_the_disk_is_full(tmp_path, monkeypatch):
    torch_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    with pytest.raises(RuntimeError, match="unexpected pos"):  # room on the disk: a real failure, passed on
        save_checkpoint(FakeGroup(("save_checkpoint", torch_error)), tmp_path, 1, False, {}, "tok")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(8 << 20, 8 << 20, 4096))
    with pytest.raises(OxrlError, match="no earlier checkpoint exists: free space and run again"):
        save_checkpoint(FakeGroup(("save_checkpoint", torch_error)), tmp_path, 1, False, {}, "tok")


def test_re_saving_the_step_latest_names_never_deletes_it_on_a_full_disk(tmp_path):
    """A run resumed at its last step saves that step again as `final`."""
    save_checkpoint(FakeGroup(), tmp_path, 3, False, {}, "tok")
    with pytest.raises(OxrlError, match=r"\(step-3\) is intact"):
        save_checkpoint(FakeGroup(("save_hf", OSError(errno.ENOSPC, "full"))), tmp_path, 3, True, {}, "tok")
    assert (tmp_path / "ds" / "latest").read_text() == "step-3" and (tmp_path / "ds" / "step-3").is_dir()
    assert not Path(tmp_path / "final").exists()


@pytest.mark.parametrize(
    "method, error",
    [("save_hf", RuntimeError("ActorDiedError: rank1 died")), ("save_checkpoint", KeyboardInterrupt())],
    ids=["a-rank-died", "second-signal"],
)
def test_a_checkpoint_stopped_half_way_leaves_no_folder_and_latest_as_it_was(tmp_path, method, error):
    save_checkpoint(FakeGroup(), tmp_path, 1, False, {}, "tok")
    with pytest.raises(type(error)):
        save_checkpoint(FakeGroup((method, error)), tmp_path, 2, False, {}, "tok")
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["latest", "step-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-000001", "ds"]
    assert (tmp_path / "ds" / "latest").read_text() == "step-1"


def test_re_saving_a_step_replaces_its_folders_whole(tmp_path):
    save_checkpoint(FakeGroup(), tmp_path, 3, True, {}, "tok")
    (tmp_path / "final" / "stale.bin").write_bytes(b"x")
    save_checkpoint(FakeGroup(), tmp_path, 3, True, {"again": 1}, "tok")
    assert sorted(p.name for p in (tmp_path / "final").iterdir()) == ["model.safetensors"]
    assert '"again": 1' in (tmp_path / "ds" / "step-3" / "oxrl_state.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "final"]


def test_resuming_removes_what_latest_does_not_name_and_keeps_the_earlier_checkpoints(tmp_path):
    for step in (5, 10):
        save_checkpoint(FakeGroup(), tmp_path, step, False, {}, "tok")
    # what a run stopped while saving step 11 (and one killed between its renames and `latest`, step 12) left
    for leftover in ("ds/.partial-step-11", ".partial-checkpoint-000011", "ds/step-12", "checkpoint-000012"):
        (tmp_path / leftover).mkdir()
    state = resume_state(tmp_path / "ds")
    assert state["step"] == 10 and state["tag"] == "step-10"
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["latest", "step-10", "step-5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-000005", "checkpoint-000010", "ds"]


def _blocked(pid: int) -> set[int]:
    mask = int(Path(f"/proc/{pid}/status").read_text().split("SigBlk:")[1].split()[0], 16)
    return {s for s in range(1, 65) if mask >> (s - 1) & 1}


def test_processes_started_shielded_keep_sigterm_pending_while_this_one_receives_it():
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        with shielded_children():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
            signal.raise_signal(signal.SIGTERM)
            assert received == []  # blocked here too while the block runs, then delivered
        assert received == [signal.SIGTERM] and signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert signal.SIGTERM in _blocked(child.pid)
        child.terminate()  # SIGTERM: pending, not fatal
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1)
        child.kill()
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_shield_command_runs_a_command_with_sigterm_blocked_or_says_why_it_cannot(tmp_path):
    shielded = subprocess.run(
        [sys.executable, "-m", "oxrl_core.cluster.shield", "grep", "SigBlk", "/proc/self/status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shielded.returncode == 0 and int(shielded.stdout.split()[1], 16) >> (signal.SIGTERM - 1) & 1
    missing = subprocess.run(
        [sys.executable, "-m", "oxrl_core.cluster.shield", "no-such-command-here"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "cannot run no-such-command-here: No such file or directory" in missing.stderr
