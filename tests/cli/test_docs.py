"""The README stays true: its config reference is current and its commands exist."""

import re
from pathlib import Path

import pytest

from oxrl_core.config.reference import END, START, reference_markdown

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_config_reference_in_readme_is_generated_from_the_schema():
    block = README.split(START)[1].split(END)[0].strip()
    assert block == reference_markdown().strip(), "stale: run python -m oxrl_core.config.reference README.md"


def test_the_two_commands_are_the_makefile_targets_and_ci_runs_the_whole_suite():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (REPO / "Makefile").read_text()
    assert "\ndemo: install\n\t.venv/bin/oxrl demo\n" in makefile and "\ntest: install\n" in makefile
    assert "\ntest-all: install\n" in makefile and "`make test-all`" in README
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["make test-all"]


def test_readme_train_commands_validate(tmp_path, monkeypatch):
    """Every `oxrl train ...` line of the README parses and validates (dry run), through the CLI app in this process:
    the console script's start-up is tested elsewhere and costs seconds per line."""
    from typer.testing import CliRunner

    from oxrl_cli.main import app

    monkeypatch.chdir(REPO)
    lines = [line.split("  #")[0].strip() for line in README.splitlines() if line.strip().startswith("oxrl train ")]
    assert len(lines) >= 5
    for line in lines:
        args = line.split()[1:]
        if "--resume" in args:
            args.remove("--resume")  # resuming needs a run; its validation is the same
        result = CliRunner().invoke(app, [*args, "--dry-run", f"run.output_dir={tmp_path}"])
        assert result.exit_code == 0 and result.exception is None, (line, result.output, result.exception)
        assert "train:" in result.output  # the resolved config was printed


def test_the_7b_lora_example_validates_with_local_stand_ins_for_its_model_and_data(tmp_path, tiny_model_dir, monkeypatch):
    """examples/cispo_lora_7b.yaml names a Hub model and GSM8K, which these machines cannot download: everything else
    in it (LoRA targets, batch arithmetic, rollout lengths) is validated with the tiny model and one prompt."""
    from typer.testing import CliRunner

    from oxrl_cli.main import app

    monkeypatch.chdir(REPO)
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    base = ["train", "rl", "--config", "examples/cispo_lora_7b.yaml", "--dry-run", f"model.name_or_path={tiny_model_dir}",
            f"data.train=[{{path: {data}}}]", f"run.output_dir={tmp_path}"]
    for overrides in ([], ["rollout.gpu_memory_utilization=0.45", "train.micro_batch_size=8", "train.grad_accum=64"]):
        result = CliRunner().invoke(app, [*base, *overrides])
        assert result.exit_code == 0 and result.exception is None, (overrides, result.output, result.exception)
        assert "lora:" in result.output and "enabled: true" in result.output


@pytest.mark.parametrize("example", ["sgrpo_tiny", "ppo_tiny"])
def test_rl_examples_that_no_integration_test_runs_as_shipped_validate(example, tmp_path, monkeypatch):
    """The CISPO example runs as shipped (tests/integration/test_small_memory.py); these differ from it in their algorithm's
    settings, whose code the integration tests run with the CISPO example's data."""
    from typer.testing import CliRunner

    from oxrl_cli.main import app

    monkeypatch.chdir(REPO)
    alg = example.removesuffix("_tiny")
    result = CliRunner().invoke(app, ["train", "rl", "--alg", alg, "--config", f"examples/{example}.yaml", "--dry-run",
                                      f"run.output_dir={tmp_path}"])
    assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)
    assert f"alg: {alg}" in result.output
