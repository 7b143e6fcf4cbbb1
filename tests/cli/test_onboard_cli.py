"""`oxrl onboard` through the console script: the report, the files it writes, its errors, --list, --verify."""

import shutil
from pathlib import Path

import pytest
import yaml

from oxrl_core.model_registry.schema import SHIPPED_DIR, load_entry

WIDE = {"COLUMNS": "250"}  # rich wraps table cells to the terminal's width
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def dry_run(monkeypatch):
    """`oxrl train COMMAND --config CONFIG --dry-run` in this process (the full load: schema and checks; the console
    script's start-up, seconds a call, is the other tests'), from the repository as `oxrl` runs: the resolved config."""
    from typer.testing import CliRunner

    from oxrl_cli.main import app

    monkeypatch.chdir(REPO)

    def run(command: str, config: Path) -> dict:
        result = CliRunner().invoke(app, ["train", command, "--config", str(config), "--dry-run"])
        assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)
        return yaml.safe_load(result.stdout)

    return run


def test_onboarding_a_model_folder_reports_it_and_writes_a_valid_entry_and_configs(
    oxrl, dry_run, tiny_model_dir, tmp_path
):
    result = oxrl("onboard", tiny_model_dir, "--out", tmp_path, env=WIDE)
    assert result.returncode == 0, result.stderr
    for row in (
        "Qwen2ForCausalLM (qwen2)",
        "causal-lm",
        "renders user/assistant with a generation prompt",
        "supports it",
        "full fine-tuning",
        "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
    ):
        assert row in result.stdout, row
    entry = load_entry(tmp_path / f"local--{tiny_model_dir.name}.yaml")
    assert entry.model == str(tiny_model_dir) and entry.status == "config-ready" and entry.recommended_mode == "full"
    configs = tmp_path / f"local--{tiny_model_dir.name}"
    for name, command in (("sft.yaml", "sl"), ("rl.yaml", "rl")):
        assert dry_run(command, configs / name)["model"]["name_or_path"] == str(tiny_model_dir)


@pytest.mark.parametrize(
    "model_dir, architecture, model_class, task",
    [
        ("tiny_qwen3_vl_model_dir", "Qwen3VLForConditionalGeneration", "image-text-to-text", "squares"),
        ("tiny_smolvlm_model_dir", "Idefics3ForConditionalGeneration", "image-text-to-text", "squares"),
        ("tiny_audio_model_dir", "Qwen2AudioForConditionalGeneration", "audio-text-to-text", "beeps"),
    ],
)
def test_onboarding_each_tiny_multimodal_model_writes_a_trainable_entry_and_configs_on_its_counting_task(
    oxrl, dry_run, request, tmp_path, model_dir, architecture, model_class, task
):
    model_dir = request.getfixturevalue(model_dir)
    result = oxrl("onboard", model_dir, "--out", tmp_path, env=WIDE)
    assert result.returncode == 0, result.stderr
    entry = load_entry(tmp_path / f"local--{model_dir.name}.yaml")
    assert (entry.architecture, entry.model_class, entry.oxrl_trainable) == (architecture, model_class, True)
    for name, command in (("sft.yaml", "sl"), ("rl.yaml", "rl")):
        assert task in dry_run(command, tmp_path / f"local--{model_dir.name}" / name)["data"]["train"][0]["path"]


def test_a_model_without_chat_template_is_reported_then_refused_with_exit_2(oxrl, tiny_model_dir, tmp_path):
    model = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir, model, ignore=shutil.ignore_patterns("chat_template.jinja"))
    result = oxrl("onboard", model, "--out", tmp_path / "registry", env=WIDE)
    assert result.returncode == 2
    assert "Qwen2ForCausalLM" in result.stdout and "stop: no chat template" in result.stdout
    # the last line: importing vLLM may log before it
    assert result.stderr.splitlines()[-1].startswith(f"error: {model}: not onboarded: no chat template")
    assert not (tmp_path / "registry").exists()


def test_uncached_hub_id_offline_is_one_line_exit_2(oxrl, tmp_path):
    result = oxrl("onboard", "not-an-org/not-cached", "--out", tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: not-an-org/not-cached: not in the Hugging Face cache")


def test_onboard_without_a_model_says_what_to_give(oxrl):
    result = oxrl("onboard")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: oxrl onboard: give a Hub id (org/name) or a model folder, or --list"


def test_full_weights_without_verify_is_refused_before_anything_is_written(oxrl, tiny_model_dir, tmp_path):
    result = oxrl("onboard", tiny_model_dir, "--out", tmp_path, "--full-weights")
    assert result.returncode == 2 and not any(tmp_path.iterdir())
    assert result.stderr.strip() == (
        "error: --full-weights: only with --verify (it says which weights the verify's RL steps train)"
    )


def test_list_prints_every_shipped_model(oxrl, tmp_path):
    result = oxrl("onboard", "--list", "--out", tmp_path, env=WIDE)
    assert result.returncode == 0, result.stderr
    shipped = [load_entry(path) for path in SHIPPED_DIR.glob("*.yaml")]
    assert f"{len(shipped)} models" in result.stdout
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 2}
    for entry in shipped:
        status = f"verified {entry.verified_date}" if entry.status == "verified" else entry.status
        assert status in rows[entry.model], rows.get(entry.model)


@pytest.mark.integration
@pytest.mark.slow  # a generated config's training step; the VLM SFT runs in tests/integration/test_vlm.py
def test_a_generated_vision_language_sft_config_trains_one_step_as_written(oxrl, tiny_vl_model_dir, tmp_path):
    """The generated config as written (its own batch split). A causal LM's generated SFT config trains in each
    family's `--verify` (tests/integration/test_families.py), through the same writer."""
    folder = tiny_vl_model_dir
    assert oxrl("onboard", folder, "--out", tmp_path).returncode == 0
    config = tmp_path / f"local--{folder.name}" / "sft.yaml"
    result = oxrl(
        "train", "sl", "--config", config, "train.steps=1", "data.val=null", f"run.output_dir={tmp_path / 'runs'}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "runs" / f"{folder.name}-sft" / "final" / "model.safetensors").is_file()
