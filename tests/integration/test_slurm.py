"""The Slurm launcher (examples/slurm/one_node.sbatch) under a real one-node Slurm (tests/slurm/start_cluster.sh,
Debian's Slurm 22.05, installed by the test where missing): preempted twice, as clusters do it, a run saves the step it reached each
time, its job submits itself again, and the last job finishes the run from the last checkpoint."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The jobs start their own clusters. Long lane (about 5 minutes: three jobs, each starting a run): the signal path it
# takes, SIGTERM to every process of a run, runs in the whole suite (test_rl.py, test_sft.py, their job-wide tests).
pytestmark = [pytest.mark.integration, pytest.mark.own_ray_cluster, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "examples" / "slurm" / "one_node.sbatch"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> dict:
    """A one-node Slurm cluster for the module; the environment its commands need. Debian's packages are installed
    where they are missing (about 30 s; CI's machines are root with apt); elsewhere the test is skipped."""
    if os.geteuid() != 0 or not (shutil.which("slurmctld") or shutil.which("apt-get")):
        pytest.skip("needs root, and Slurm or apt-get to install it (apt-get install slurmctld slurmd)")
    state = tmp_path_factory.mktemp("slurm")
    started = subprocess.run(
        ["bash", str(REPO / "tests/slurm/start_cluster.sh"), str(state)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OXRL_SLURM_AUTO_INSTALL": "1"},
    )
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    yield {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    subprocess.run(
        ["bash", str(REPO / "tests/slurm/stop_cluster.sh"), str(state), "--purge"], capture_output=True, timeout=180
    )


def slurm_command(env: dict, *args: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, f"{args}: {result.stderr}"
    return result.stdout.strip()


def jobs(env: dict) -> dict[str, str]:
    """Job id -> state of the jobs Slurm knows (pending, running, or ended within its memory of them)."""
    out = slurm_command(env, "squeue", "--noheader", "--states=all", "--format=%i %T")
    return dict(line.split() for line in out.splitlines())


def wait_for(condition, what: str, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(1)
    return found


def test_a_preempted_run_saves_resubmits_itself_and_finishes_from_its_last_checkpoint(slurm, tmp_path, tiny_model_dir):
    env = {
        **slurm,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "OXRL_OUTPUT_DIR": str(tmp_path),
        "OXRL_RUN_NAME": "run",
        "OXRL_ARGS": f"train sl --alg sft --config {REPO / 'examples/sft_tiny.yaml'} "
        f"data.train.0.path={REPO / 'examples/data/arithmetic_sft_train.jsonl'} "
        f"train.steps=60 run.checkpoint_every=4 data.val=null",
    }
    run, latest = tmp_path / "run", tmp_path / "run" / "ds" / "latest"
    first = slurm_command(env, "sbatch", "--parsable", f"--chdir={tmp_path}", str(SBATCH))

    def ended(job: str) -> str:
        """The job's output once its run has exited, else ''."""
        log = tmp_path / f"oxrl-oxrl-{job}.out"
        return log.read_text() if log.is_file() and "oxrl exited with" in log.read_text() else ""

    def checkpointed(job: str, after: int = 0) -> None:
        """Wait until the job's run has saved a step after `after`; fail at once if its run ended first."""
        wait_for(
            lambda: ended(job) or (latest.is_file() and latest.read_text() != f"step-{after}"),
            f"job {job}'s checkpoint",
        )
        assert not ended(job), ended(job)[-3000:]

    def stopped(job: str) -> int:
        """The step at which the job's run stopped on SIGTERM, once its job has resubmitted itself."""
        text = wait_for(lambda: ended(job), f"job {job} to end")
        assert "oxrl exited with 143" in text and "Traceback" not in text, text[-3000:]
        match = re.search(r"stopped by SIGTERM after step (\d+); to continue: oxrl train sl .* --resume", text)
        assert match, text[-3000:]
        step = int(match[1])
        assert latest.read_text() == f"step-{step}" and (run / "ds" / f"step-{step}" / "oxrl_state.json").is_file()
        assert not list(run.glob(".partial-*")) and not list((run / "ds").glob(".partial-*"))
        return step

    # 1. scancel --signal=TERM --full: SIGTERM to the job script and everything it started, once a step is saved
    checkpointed(first)
    slurm_command(env, "scancel", "--signal=TERM", "--full", first)
    step = stopped(first)
    second = wait_for(lambda: next((j for j, s in jobs(env).items() if int(j) > int(first)), None), "the resubmission")

    # 2. preemption by a job of a higher partition: SIGTERM to every process of the job, SIGKILL after KillWait
    checkpointed(second, after=step)
    urgent = slurm_command(env, "sbatch", "--parsable", "--partition=urgent", f"--chdir={tmp_path}", "--wrap=sleep 2")
    again = stopped(second)
    assert again > step
    assert (
        wait_for(
            lambda: jobs(env).get(second) not in ("RUNNING", "COMPLETING") and jobs(env).get(second),
            "the preempted job's state",
        )
        == "PREEMPTED"
    )

    # 3. the job it submitted resumes from the last checkpoint and finishes the run
    third = wait_for(
        lambda: next((j for j in jobs(env) if int(j) > int(second) and j != urgent), None), "the second resubmission"
    )
    text = wait_for(lambda: ended(third), "the run's end")
    assert "oxrl exited with 0" in text and f"resuming from the checkpoint of step {again} " in text, text[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["first_step"] == again + 1 and (run / "final" / "model.safetensors").is_file()
