"""The quick start (docs/quickstart.md) runs as a user runs it: its commands in order, through the console script,
from a folder holding the shipped examples, each reading what the one before wrote."""

import json
import os
import shlex
import subprocess
import sys

import pytest
from doc_pages import QUICKSTART, REPO, commands

OXRL = os.path.join(os.path.dirname(sys.executable), "oxrl")

pytestmark = pytest.mark.integration


def test_the_quickstart_trains_sft_then_rl_with_lora_merges_and_evaluates(tmp_path, tiny_model_dir, ray_address):
    steps = commands(pages=[QUICKSTART])
    assert [c.text.split()[:2] for c in steps] == [
        ["source", ".venv/bin/activate"],
        ["oxrl", "doctor"],
        ["oxrl", "preprocess"],
        ["oxrl", "preprocess"],
        ["oxrl", "train"],
        ["oxrl", "train"],
        ["oxrl", "merge-lora"],
        ["oxrl", "eval"],
    ]
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / tiny_model_dir.name).symlink_to(tiny_model_dir)  # oxrl-tiny, built once a session
    env = {**os.environ, "OXRL_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "RAY_ADDRESS": ray_address}
    for step in steps[2:]:  # the environment is this one; the doctor has tests of its own
        args = shlex.split(step.text)[1:]
        if args[0] == "train":
            args.append("train.steps=2")  # the page's runs are minutes long; the same commands, two steps
        result = subprocess.run([OXRL, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, (step.where, result.stderr[-3000:])

    rl_run = tmp_path / "checkpoints" / "quick-rl"
    assert (rl_run / "final" / "adapter_config.json").is_file()
    assert json.loads((rl_run / "summary.json").read_text())["steps"] == 2
    assert (tmp_path / "merged" / "quick-rl" / "config.json").is_file()
    summaries = sorted((tmp_path / "eval").rglob("summary.json"))
    assert [s.parent.name for s in summaries] == ["model_a", "model_b"]
    for summary in summaries:
        metrics = json.loads(summary.read_text())["metrics"]
        assert 0.0 <= metrics["pass@1"] <= metrics["pass@8"] <= 1.0
