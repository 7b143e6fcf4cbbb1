"""The deadline rule of the driver's waits on actors, the process groups' timeout, and the reading of a stack dump."""

import datetime
import faulthandler
import threading

import pytest

from oxrl_core.cluster.watchdog import Deadlines, collective_timeout, innermost_call


def test_a_phase_gets_four_times_the_floor_the_first_time_it_runs():
    deadlines = Deadlines(floor_s=30)
    assert deadlines.bound("train_step", units=8) == 120
    deadlines.record("generate", 64, 500.0)  # another phase's history changes nothing
    assert deadlines.bound("train_step", units=8) == 120


def test_later_runs_get_five_times_the_longest_earlier_run_never_less_than_the_floor():
    deadlines = Deadlines(floor_s=30)
    deadlines.record("train_step", 8, 10.0)
    deadlines.record("train_step", 8, 4.0)  # shorter: the longest stays
    assert deadlines.bound("train_step", units=8) == 50
    fast = Deadlines(floor_s=30)
    fast.record("train_step", 8, 1.0)
    assert fast.bound("train_step", units=8) == 30  # 5 s would be under the floor


def test_more_work_scales_the_bound_up_and_less_work_never_down():
    deadlines = Deadlines(floor_s=1)
    deadlines.record("generate", 64, 10.0)
    assert deadlines.bound("generate", units=128) == 100
    assert deadlines.bound("generate", units=8) == 50  # a small batch (eval) may take as long as a full one
    deadlines.record("generate", 8, 20.0)  # the small batch ran slower: it now bounds the large one too
    assert deadlines.bound("generate", units=64) == 800


def test_a_floor_of_zero_turns_deadlines_off_and_collectives_wait_a_day():
    deadlines = Deadlines(floor_s=0)
    assert deadlines.bound("train_step") is None
    deadlines.record("train_step", 1, 10.0)
    assert deadlines.bound("train_step") is None
    assert collective_timeout(0) == datetime.timedelta(days=1)
    assert collective_timeout(30) == datetime.timedelta(seconds=120)  # the first run's bound


def waiting_in_a_collective(path):
    with open(path, "w") as f:
        faulthandler.dump_traceback(f, all_threads=True)


def test_the_innermost_call_of_the_main_thread_is_read_from_a_faulthandler_dump(tmp_path):
    # another thread, newer than the main one, is listed before it
    started, done = threading.Event(), threading.Event()
    helper = threading.Thread(target=lambda: (started.set(), done.wait()))
    helper.start()
    started.wait()
    waiting_in_a_collective(tmp_path / "dump")
    done.set()
    helper.join()
    assert (tmp_path / "dump").read_text().count("hread 0x") >= 2  # more where earlier tests left threads
    assert (
        innermost_call((tmp_path / "dump").read_text())
        == f"waiting_in_a_collective (test_watch.py:{waiting_in_a_collective.__code__.co_firstlineno + 2})"
    )
    assert innermost_call("") == ""
    assert innermost_call("(no stacks: a stopped process cannot answer)") == ""


@pytest.mark.parametrize("floor", [-1.0])
def test_the_config_refuses_a_negative_hang_timeout(floor):
    from pydantic import ValidationError

    from oxrl_core.config.sections import RunSection

    with pytest.raises(ValidationError, match="hang_timeout_s"):
        RunSection(hang_timeout_s=floor)
