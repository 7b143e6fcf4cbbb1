"""`oxrl doctor` through the console script, with the real checks on this machine."""

import json
import os
import time

import jsonschema
import pytest

from oxrl_core.doctor.report import Report

SCHEMA = Report.model_json_schema()


def report_of(result) -> dict:
    report = json.loads(result.stdout)
    jsonschema.validate(report, SCHEMA)
    return report


def checks_of(report: dict) -> dict[str, dict]:
    return {check["name"]: check for check in report["checks"]}


@pytest.fixture(scope="module")
def planted(oxrl, tmp_path_factory) -> dict:
    """One deep doctor run on a machine with two planted warnings, each check's own subject: an nvcc that is found but
    cannot run, and a build lock a killed run left an hour ago. (Each doctor run costs 15 s; one serves three tests.)"""
    home = tmp_path_factory.mktemp("doctor")
    nvcc = home / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("not a program")
    lock = home / "ext" / "py311_cpu" / "cpu_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    os.utime(lock, (time.time() - 3600, time.time() - 3600))
    env = {"CUDA_HOME": str(home / "cuda"), "TORCH_EXTENSIONS_DIR": str(home / "ext")}
    return {"env": env, "lock": lock, "result": oxrl("doctor", "--json", "--deep", env=env)}


def test_json_report_validates_against_the_schema_and_exit_code_follows_it(planted):
    result = planted["result"]
    report = report_of(result)
    assert result.returncode == (1 if report["status"] == "fail" else 0), result.stdout
    checks = checks_of(report)
    for name in (
        "python",
        "os",
        "cpu",
        "ram",
        "disk OXRL_DATA_DIR",
        "disk OXRL_CHECKPOINT_DIR",
        "/dev/shm",
        "nvcc",
        "torch",
        "transformers",
        "peft",
        "deepspeed",
        "vllm",
        "vision",
        "audio",
        "ray",
        "datasets",
        "mlflow",
        "huggingface",
        "deepspeed accelerator",
        "ray cluster",
        "all-reduce",
        "build locks",
    ):
        assert name in checks, name
    if "gpu" in checks:  # no NVIDIA GPU here: CPU mode, explained, not a failure
        assert checks["gpu"]["status"] == "ok" and "CPU mode" in checks["gpu"]["finding"]
    assert checks["ray cluster"]["status"] == "ok" and checks["all-reduce"]["status"] == "ok", checks


def test_warnings_exit_0_unless_strict(oxrl, planted):
    relaxed = planted["result"]
    report = report_of(relaxed)
    assert checks_of(report)["nvcc"]["status"] == "warn" and report["status"] == "warn", relaxed.stdout
    assert relaxed.returncode == 0
    strict = oxrl("doctor", "--json", "--strict", env=planted["env"])
    assert strict.returncode == 1 and report_of(strict)["status"] == "warn"


def test_a_failing_check_exits_1_and_the_table_shows_its_fix(oxrl, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = oxrl("doctor", env={"OXRL_CHECKPOINT_DIR": str(blocker / "checkpoints"), "COLUMNS": "250"})
    assert result.returncode == 1
    assert "oxrl doctor: fail" in result.stdout
    assert "point OXRL_CHECKPOINT_DIR at a writable folder" in result.stdout


def test_bad_timeout_is_a_usage_error(oxrl):
    result = oxrl("doctor", "--timeout", "0")
    assert result.returncode == 2 and "--timeout" in result.stderr


@pytest.mark.integration
def test_smoke_runs_one_rl_step_through_the_real_stack(oxrl):
    result = oxrl("doctor", "--smoke", "--json")
    checks = checks_of(report_of(result))
    assert checks["rl step"]["status"] == "ok", checks["rl step"]
    assert "policy version 1" in checks["rl step"]["finding"]


def test_a_stale_build_lock_makes_the_doctor_warn_and_a_run_stop_at_once_naming_it(oxrl, planted, tmp_path):
    """A run killed while DeepSpeed compiled an op left its lock: runs would wait on it until their hang deadline."""
    lock = planted["lock"]
    check = checks_of(report_of(planted["result"]))["build locks"]
    assert check["status"] == "warn" and "1.0 h old" in check["finding"] and check["fix"] == f"rm {lock}", check
    sft = ("train", "sl", "--alg", "sft", "--config", "examples/sft_tiny.yaml", f"run.output_dir={tmp_path}")
    start = time.monotonic()
    run = oxrl(*sft, env=planted["env"])
    assert time.monotonic() - start < 60
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1] == (
        f"error: {lock}: a build lock left by an interrupted build (1.0 h old, held by no process); every run that "
        f"builds this op waits on it. Clear it: rm {lock}"
    ), run.stderr[-2000:]
