"""The Python API: its page's snippet runs as written, and mistakes are refused before anything starts."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import doc_pages
import pytest

from oxrl_core import Trainer
from oxrl_core.errors import OxrlError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_the_python_api_pages_snippet_trains_sft_then_rl(tmp_path, tiny_model_dir):
    [snippet] = [b.text for b in doc_pages.blocks("python") if "Trainer(" in b.text]
    # `oxrl-tiny` already built, as on any run after the first (the build itself is tested in test_tiny_model.py)
    shutil.copytree(tiny_model_dir, tmp_path / "ck" / "oxrl-tiny")
    result = subprocess.run(
        [sys.executable, "-c", snippet],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OXRL_CHECKPOINT_DIR": str(tmp_path / "ck"), "OXRL_DATA_DIR": str(tmp_path / "data")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sft_loss, reward = map(float, result.stdout.strip().splitlines()[-1].split())
    assert sft_loss < 5 and 0 <= reward <= 1
    assert (tmp_path / "ck" / "py-rl" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "data" / "arithmetic" / "rl_train.jsonl").is_file()  # task="reasoning" wrote its data


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"alg": "reinforce", "data": "x.jsonl"}, "alg='reinforce'"),
        ({"task": "chat"}, "task='chat': not a task"),
        ({"alg": "dpo"}, "data: give a data file"),
        ({"task": "reasoning", "alg": "dpo"}, "task='reasoning' is RL"),
        (
            {"alg": "sft", "data": "examples/data/arithmetic_sft_train.jsonl", "train": {"lr": "fast"}},
            "train.lr='fast'",
        ),
        ({"alg": "sft", "data": "missing.jsonl"}, "missing.jsonl"),
    ],
)
def test_mistakes_raise_one_clear_error_before_anything_starts(kwargs, message, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(OxrlError, match=re.escape(message)):
        Trainer(model=str(tiny_model_dir), run={"output_dir": str(tmp_path)}).train(**kwargs)
    assert not any(tmp_path.iterdir())


def test_machine_defaults_make_the_batch_add_up_on_cpu():
    from oxrl_core.config.schema import RLConfig, SLConfig
    from oxrl_core.resolve.run import this_machines_defaults

    assert this_machines_defaults({"train": {"batch_size": 32}}, RLConfig) == {
        "run": {"train_ranks": 1},
        "train": {"micro_batch_size": 8, "grad_accum": 4},
    }
    assert this_machines_defaults({"train": {"batch_size": 4}}, SLConfig)["train"] == {
        "micro_batch_size": 4,
        "grad_accum": 1,
    }
    assert this_machines_defaults({"train": {}, "run": {"train_ranks": 2}}, SLConfig) == {
        "run": {"train_ranks": 2},
        "train": {"micro_batch_size": 4, "grad_accum": 1},
        "deepspeed": {"zero_stage": 3},
    }
