"""A run whose actor stops answering (frozen with SIGSTOP: what a hung collective, a GPU stuck in a kernel or a
swapping host look like from outside) ends within its deadline, names the stuck actor, keeps its stacks and its last
checkpoint, leaves no process behind, and resumes. A run whose actor dies leaves a crash report that `oxrl report`
turns into an issue body."""

import json
import re
import signal
from pathlib import Path

import pytest

from oxrl_core.cluster.watchdog import FIRST_RUN_FACTOR

pytestmark = pytest.mark.integration
HANG_TIMEOUT_S = 30  # start-up on a loaded 2-core machine may take most of its 120 s first-run bound


def hang_args(tiny_model_dir, out: Path) -> list[str]:
    return [
        "train",
        "rl",
        "--config",
        "examples/cispo_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        f"run.output_dir={out}",
        "run.name=run",
        "train.steps=2",
        "run.checkpoint_every=1",
        "data.val=null",
        f"run.hang_timeout_s={HANG_TIMEOUT_S}",
        "train.batch_size=32",
        "train.grad_accum=1",
        "rollout.max_tokens=8",
        "reward.func=rl_test_rewards:digit_share_pausing_once",
    ]


def pid_in_placement(run: Path, actor: str) -> int:
    placement = json.loads((run / "placement.json").read_text())
    return placement["ranks"][1]["pid"] if actor == "rank1" else placement["engines"][0][0]["pid"]


@pytest.mark.own_ray_cluster  # every process of the run is its own: none may outlive it, the stopped one included
# The watchdog's deadlines, naming and stacks are unit-tested (tests/unit/test_watch.py); a run waits out a real
# deadline (minutes): the trainer rank's in the whole suite, the engine's (and a resume after it) in the long lane
@pytest.mark.parametrize(
    "stuck, peer",
    [("rank1", "rank0"), pytest.param("engine0", "rank0", marks=pytest.mark.slow)],
    ids=["trainer-rank", "vllm-engine"],
)
def test_a_stopped_actor_ends_the_run_named_with_stacks_and_a_checkpoint_to_resume(
    tmp_path, tiny_model_dir, oxrl, oxrl_signalled, stuck, peer
):
    """Stopped in step 2's reward phase, after step 1's checkpoint: a trainer rank, whose peer then waits for it in
    ZeRO-3's all-gather of the logprobs pass; or the vLLM engine, for which trainer rank 0 then waits inside the
    weight broadcast (gloo)."""
    args, run, pause = hang_args(tiny_model_dir, tmp_path), tmp_path / "run", tmp_path / "pause"
    env = {
        "PYTHONPATH": str(Path(__file__).parent),
        "PAUSE_FILE": str(pause),
        "PAUSE_AFTER": str(run / "ds" / "latest"),
    }
    hung = oxrl_signalled(
        args,
        lambda stdout: pause.exists(),
        signal.SIGSTOP,
        env=env,
        after_signal=pause.unlink,
        pid_of=lambda: pid_in_placement(run, stuck),
    )
    assert hung.returncode == 1, hung.stderr[-3000:]
    # every phase has run once before the first checkpoint: its deadline is 5 x its longest run, at least the floor
    assert hung.seconds_to_exit < FIRST_RUN_FACTOR * HANG_TIMEOUT_S + 60, hung.seconds_to_exit
    message = hung.stderr.strip().splitlines()[-1]
    assert message.startswith("hang: ") and f"{stuck} (pid {pid_in_placement(run, stuck)} on " in message, message
    assert f"{stuck} (pid" in message and ", stopped)" in message, message
    assert message.endswith(" --resume") and f"Stacks: {run / 'stacks.txt'}" in message, message
    stacks = (run / "stacks.txt").read_text()
    assert re.search(
        rf"=== {stuck} \(pid \d+ .*, stopped\) -- stuck\n\(no stacks: a stopped process cannot answer\)", stacks
    )
    # every other actor's Python stacks: the ranks' and the engine's
    assert all(f"=== {actor} (pid" in stacks for actor in ("rank0", "rank1", "engine0"))
    assert re.search(r'File ".*", line \d+ in ', stacks), stacks[-3000:]
    # the peer waiting for the stopped one in a collective is named as stuck too, with where it waits
    assert re.search(rf"{peer} \(pid \d+ on [^,]+, [a-z-]+, in \w+ \(\w+\.py:\d+\)\)", message), message
    assert message.startswith("hang: token_logprobs " if stuck == "rank1" else "hang: weight broadcast "), message
    assert "--- hang" in (run / "crash.txt").read_text()
    crash = json.loads((run / "crash.json").read_text())
    assert crash["error"]["class"] == "Hang" and crash["step"] == 2 and crash["likely_cause"], crash["error"]
    assert (run / "ds" / "latest").read_text() == "step-1" and "step 2/2" not in hung.stdout  # the last finished step
    assert hung.leftover_processes == [], hung.leftover_processes

    if stuck == "engine0":  # both hangs leave the same step-1 checkpoint; a killed vLLM could also leave state behind
        resumed = oxrl(*args, "--resume", env={"PYTHONPATH": env["PYTHONPATH"]})
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert [h["step"] for h in json.loads((run / "summary.json").read_text())["history"]] == [2]  # trained again


def test_a_killed_engine_leaves_a_crash_report_that_oxrl_report_turns_into_an_issue_naming_it_and_the_step(
    tmp_path, tiny_model_dir, oxrl, oxrl_signalled
):
    """The vLLM engine is killed in step 1's reward phase; the run fails at the refresh that follows."""
    args, run, pause = hang_args(tiny_model_dir, tmp_path), tmp_path / "run", tmp_path / "pause"
    env = {"PYTHONPATH": str(Path(__file__).parent), "PAUSE_FILE": str(pause)}
    killed = oxrl_signalled(
        args,
        lambda stdout: pause.exists(),
        signal.SIGKILL,
        env=env,
        after_signal=pause.unlink,
        pid_of=lambda: pid_in_placement(run, "engine0"),
    )
    assert killed.returncode != 0 and "ActorDiedError" in killed.stderr, killed.stderr[-3000:]
    crash = json.loads((run / "crash.json").read_text())
    assert (crash["error"]["actor"], crash["step"], crash["phase"], crash["policy_version"]) == (
        "engine0",
        1,
        "refresh",
        0,
    )
    assert crash["error"]["class"].endswith("ActorDiedError") and "(`dmesg`)" in crash["fix"]
    assert {"rank0", "engine0"} <= crash["logs"].keys() and crash["config_sha256"]
    report = oxrl("report", run)
    assert report.returncode == 0, report.stderr
    title = report.stdout.splitlines()[0]
    assert title == "# ActorDiedError in engine0 at step 1 (refresh)", title
    assert "<summary>Last lines of engine0.log</summary>" in report.stdout and (run / "issue.md").is_file()
