"""The run folder shared by every loop: refusing to overwrite, resuming, data reports."""

import json
from functools import partial
from pathlib import Path

from rich.console import Console

from oxrl_core.data.records import DataReport
from oxrl_core.errors import OxrlError


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
