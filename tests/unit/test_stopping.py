"""Stopping on signals (loops/signals.py), signals held while Ray starts, and checkpoints on a full disk."""

import errno
import shutil
import signal
from collections import namedtuple
from pathlib import Path

import pytest
from rich.console import Console

from oxrl_core.cluster.session import signals_held
from oxrl_core.errors import OxrlError
from oxrl_core.loops.run_folder import save_checkpoint
from oxrl_core.loops.signals import Stopped, stop_on_signals


def test_the_first_signal_during_the_steps_only_asks_the_loop_to_stop_after_its_step(tmp_path):
    with stop_on_signals(tmp_path, Console(file=open(tmp_path / "out", "w"))) as signals:
        signals.steps_running = True
        signal.raise_signal(signal.SIGTERM)  # no exception: the step goes on
        assert signals.received == signal.SIGTERM
        stopped = signals.stop(3)
    assert str(stopped) == "stopped by SIGTERM after step 3" and stopped.exit_code == 143
    assert "finishing this step, then a checkpoint" in (tmp_path / "out").read_text()


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

    def call(self, method: str, **kwargs) -> list:
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


@pytest.mark.parametrize("method, error", [
    ("save_hf", OSError(errno.ENOSPC, "No space left on device")),
    ("save_checkpoint", RuntimeError("SafetensorError: I/O error: No space left on device (os error 28)")),
], ids=["oserror", "in-a-message"])
def test_a_full_disk_removes_the_partial_checkpoint_and_keeps_the_last_one(tmp_path, method, error):
    save_checkpoint(FakeGroup(), tmp_path, 1, False, {}, "tok")
    with pytest.raises(OxrlError, match=r"checkpoint of step 2: no space left .* the last complete checkpoint "
                                        r"\(step-1\) is intact: free space and rerun with --resume"):
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
