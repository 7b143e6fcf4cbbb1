"""The run folder shared by every loop: refusing to overwrite, resuming, data reports."""

import json
from functools import partial
from pathlib import Path

from rich.console import Console

from oxrl_core.config.load import dump_config
from oxrl_core.data.records import DataReport
from oxrl_core.errors import OxrlError


def open_run_folder(config, resume: bool) -> tuple[Path, Path, dict, str]:
    """(run folder, its DeepSpeed folder, the state to resume or {}, the resolved config as YAML).

    A run folder holding a checkpoint is only ever continued (`--resume`), never overwritten.
    """
    run_dir = config.run.output_dir / config.run.name
    ds_dir = run_dir / "ds"
    state = resume_state(ds_dir) if resume else refuse_overwrite(ds_dir)
    config_yaml = dump_config(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_yaml)
    return run_dir, ds_dir, state, config_yaml


def load_tokenizer(model_path: str):
    """The model's tokenizer and the id that pads batches (pad token, else EOS)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return tokenizer, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def resume_state(ds_dir: Path) -> dict:
    """The loop state saved with the last complete checkpoint (`ds/latest` names it)."""
    latest = ds_dir / "latest"
    if not latest.is_file():
        raise OxrlError(f"--resume: {ds_dir.parent} holds no checkpoint ({latest} is missing); run without --resume to start")
    tag = latest.read_text().strip()
    return {"tag": tag, **json.loads((ds_dir / tag / "oxrl_state.json").read_text())}


def refuse_overwrite(ds_dir: Path) -> dict:
    if (ds_dir / "latest").is_file():
        raise OxrlError(f"run.name: {ds_dir.parent} already holds a run; pass --resume to continue it or choose another run.name")
    return {}


def report_data(reports: list[DataReport], run_dir: Path, console: Console) -> None:
    """Print a line per skipped record (the first few) and keep them all in the run folder."""
    problems = [p for r in reports for p in r.problems]
    say = partial(console.print, soft_wrap=True, highlight=False, markup=False)  # paths and records print verbatim
    for r in reports:
        say(f"data {r.path}: {r.kept} of {r.total} records used, {len(r.problems)} skipped")
    for p in problems[:10]:
        say(f"  skipped {p}")
    if len(problems) > 10:
        say(f"  ... and {len(problems) - 10} more (all in skipped_records.txt)")
    if problems:
        (run_dir / "skipped_records.txt").write_text("".join(f"{p}\n" for p in problems))
