"""The `oxrl` console script: help, version, errors, dry runs, completions."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from oxrl_core.algs.registry import RL_ALGS, SL_ALGS

REPO = Path(__file__).resolve().parents[2]


def test_help_lists_every_command(oxrl):
    result = oxrl("--help")
    assert result.returncode == 0
    for command in ("train", "doctor", "onboard", "merge-lora", "preprocess", "eval", "report", "demo"):
        assert command in result.stdout
    train = oxrl("train", "--help")
    assert "sl" in train.stdout and "rl" in train.stdout


def test_version(oxrl):
    result = oxrl("--version")
    assert result.returncode == 0 and result.stdout.strip() == "oxrl 0.1.0"


def test_the_cli_module_imports_none_of_the_training_stack():
    """`oxrl --help`, `--version` and shell completion import oxrl_cli.main: torch, Ray, vLLM and DeepSpeed would
    cost seconds before anything is printed. (Its start-up time is a benchmark's business, not a test's.)"""
    heavy = ("torch", "ray", "vllm", "deepspeed", "transformers")
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, oxrl_cli.main; print([m for m in {heavy!r} if m in sys.modules])"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert loaded.stdout.strip() == "[]"


def test_train_rl_dry_run_validates_an_rl_config(oxrl, tiny_model_dir, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    args = (
        "train",
        "rl",
        "--alg",
        "sgrpo",
        f"model.name_or_path={tiny_model_dir}",
        f"data.train=[{{path: {data}}}]",
        f"run.output_dir={tmp_path}",
        "train.batch_size=8",
        "train.micro_batch_size=8",
        "train.grad_accum=1",
    )
    result = oxrl(*args, "--dry-run")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["train"]["alg"] == "sgrpo" and resolved["rollout"]["force_strict_on_policy"] is True
    bad = oxrl(*args, "rollout.n_samples=3", "--dry-run")
    assert bad.returncode == 2 and "multiple of rollout.n_samples (3)" in bad.stderr


def test_dry_run_resolves_the_reward_function_as_the_run_would(oxrl, tiny_model_dir, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    common = (
        f"model.name_or_path={tiny_model_dir}",
        f"data.train=[{{path: {data}}}]",
        f"run.output_dir={tmp_path}",
        "train.batch_size=8",
        "train.micro_batch_size=8",
        "train.grad_accum=1",
        "--dry-run",
    )
    for command in (("train", "rl", "--alg", "cispo"), ("train", "sl", "--alg", "online-dpo")):
        bad = oxrl(*command, *common, "reward.func=no_such_module:fn")
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
        assert bad.stderr.strip().splitlines() == [
            "error: reward.func='no_such_module:fn': cannot import (No module named 'no_such_module')"
        ]
        assert oxrl(*command, *common, "reward.func=math").returncode == 0


def test_bad_config_is_one_line_exit_2_without_traceback(oxrl, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {name_or_path: oxrl-tiny}\ntrain: {lr: 1e-5, warmpu: 3}\n")
    result = oxrl("train", "sl", "--config", str(config))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown key 'train.warmpu'" in lines[0] and "warmup_steps" in lines[0]


def test_missing_model_path_is_one_clear_line(oxrl, tmp_path):
    data = tmp_path / "t.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    result = oxrl("train", "sl", "model.name_or_path=/does/not/exist", f"data.train=[{{path: {data}}}]")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: model.name_or_path='/does/not/exist': no such folder; give a model folder, a Hub id (org/name) or oxrl-tiny"
    )


def test_dry_run_prints_the_resolved_config_which_round_trips(oxrl, tiny_model_dir, tmp_path):
    data = tmp_path / "t.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    first = oxrl(
        "train",
        "sl",
        "--config",
        str(REPO / "examples" / "sft_tiny.yaml"),
        "--dry-run",
        f"model.name_or_path={tiny_model_dir}",
        f"data.train=[{{path: {data}}}]",
        "data.val=null",
        "train.lr=2e-5",
    )
    assert first.returncode == 0, first.stderr
    resolved = yaml.safe_load(first.stdout)
    assert resolved["train"]["lr"] == 2e-5 and resolved["train"]["alg"] == "sft"
    saved = tmp_path / "resolved.yaml"
    saved.write_text(first.stdout)
    second = oxrl("train", "sl", "--config", str(saved), "--dry-run")
    assert second.returncode == 0 and second.stdout == first.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_shipped_completion_scripts_match_the_app(oxrl, shell):
    # Click's completion protocol: the app itself prints the script for a shell.
    result = oxrl(env={"_OXRL_COMPLETE": f"source_{shell}"})
    assert result.returncode == 0, result.stderr
    shipped = REPO / "completions" / f"oxrl.{shell}"
    assert shipped.read_text() == result.stdout, f"regenerate with: _OXRL_COMPLETE=source_{shell} oxrl > {shipped}"


@pytest.mark.parametrize(
    "words, expected",
    [
        ("oxrl train sl --alg ", list(SL_ALGS)),  # every registered name of the loop, its default first
        ("oxrl train sl --alg s", ["sft", "simpo", "spin"]),
        ("oxrl train rl --alg ", list(RL_ALGS)),
    ],
)
def test_alg_completes_the_algorithm_names(oxrl, words, expected):
    # what the shipped bash script asks the app for at a TAB
    cword = len(words.split()) - (not words.endswith(" "))
    result = oxrl(env={"_OXRL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)})
    assert result.returncode == 0 and result.stdout.split() == expected


def test_a_runs_driver_imports_none_of_the_ranks_model_building_stack():
    """Every `oxrl train` process imports the loops; the ranks alone build models. torch.compile's and the packed
    attention's imports (torch._dynamo, transformers' masking) cost each driver about 2 s."""
    rank_only = ("torch._dynamo", "transformers.masking_utils", "deepspeed", "vllm", "oxrl_core.training.build")
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys, oxrl_core.loops.train; print([m for m in {rank_only!r} if m in sys.modules])",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert loaded.stdout.strip() == "[]"
