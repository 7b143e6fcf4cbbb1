"""Paths a run hands to its actors are absolute: on a joined Ray cluster the actors' working folder is not the
driver's, so a relative model folder or output folder would point elsewhere for them."""

from pathlib import Path
from types import SimpleNamespace

from oxrl_core.loops.run_folder import open_run_folder
from oxrl_core.models.hub import resolve_model


def test_a_relative_model_folder_resolves_to_its_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "runs" / "sft" / "final").mkdir(parents=True)
    (tmp_path / "runs" / "sft" / "final" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("runs/sft/final") == str(tmp_path / "runs" / "sft" / "final")


def test_a_relative_output_dir_gives_an_absolute_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = SimpleNamespace(run=SimpleNamespace(output_dir=Path("checkpoints"), name="r"))
    monkeypatch.setattr("oxrl_core.loops.run_folder.dump_config", lambda config: "run: {}\n")
    run_dir, ds_dir, state, _ = open_run_folder(config, resume=False)
    assert run_dir == tmp_path / "checkpoints" / "r" and ds_dir == run_dir / "ds" and state == {}
