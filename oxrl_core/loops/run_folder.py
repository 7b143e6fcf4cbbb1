"""The run folder shared by every loop: refusing to overwrite, resuming, checkpoints, data reports."""

import errno
import json
import os
import shutil
from pathlib import Path

from oxrl_core.config.load import dump_config
from oxrl_core.errors import OxrlError
from oxrl_core.training.engine import TrainEngine

PARTIAL = ".partial-"  # the prefix of a checkpoint folder being written (hidden: no `checkpoint-*` pattern takes it)


def open_run_folder(config, resume: bool) -> tuple[Path, Path, dict, str]:
    """(run folder, its DeepSpeed folder, the state to resume or {}, the resolved config as YAML).

    A run folder holding a checkpoint is only ever continued (`--resume`), never overwritten.
    """
    run_dir = (config.run.output_dir / config.run.name).absolute()  # the actors' working folder may be another
    ds_dir = run_dir / "ds"
    state = resume_state(ds_dir) if resume else refuse_overwrite(ds_dir)
    config_yaml = dump_config(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_yaml)
    return run_dir, ds_dir, state, config_yaml


def resume_state(ds_dir: Path) -> dict:
    """The loop state saved with the last complete checkpoint (`ds/latest` names it). Folders a stopped run was
    writing (PARTIAL), or had written but not yet named in `latest`, are removed: the resumed run writes them again."""
    latest = ds_dir / "latest"
    if not latest.is_file():
        raise OxrlError(
            f"--resume: {ds_dir.parent} holds no checkpoint ({latest} is missing); run without --resume to start"
        )
    tag = latest.read_text().strip()
    state = {"tag": tag, **json.loads((ds_dir / tag / "oxrl_state.json").read_text())}
    unnamed = [
        f for f in [*ds_dir.glob("step-*"), *ds_dir.parent.glob("checkpoint-*")] if _step(f.name) > state["step"]
    ]
    for folder in [*ds_dir.glob(PARTIAL + "*"), *ds_dir.parent.glob(PARTIAL + "*"), *unnamed]:
        shutil.rmtree(folder, ignore_errors=True)
    return state


def _step(name: str) -> int:
    """The step of a checkpoint folder's name (`step-16`, `checkpoint-000016`); -1 for any other name."""
    number = name.rpartition("-")[2]
    return int(number) if number.isdigit() else -1


def save_checkpoint(group, run_dir: Path, step: int, final: bool, loop_state: dict, tokenizer_dir: str) -> Path:
    """Step `step`'s checkpoint: DeepSpeed's state and the loop's (`ds/step-N`, what --resume reads) and the Hugging
    Face folder (`checkpoint-N`, or `final`), which it returns. Both are written under a temporary name (PARTIAL) and
    renamed once every rank has finished; `ds/latest` is replaced last. A checkpoint is therefore complete and named
    by `latest`, or not there: whatever stops the writing (a dead rank, a second signal, a full disk) takes the
    temporary folders with it, and a full disk is one line."""
    ds_dir, tag = run_dir / "ds", f"step-{step}"
    hf_dir = run_dir / ("final" if final else f"checkpoint-{step:06d}")
    ds_partial, hf_partial = (folder.with_name(PARTIAL + folder.name) for folder in (ds_dir / tag, hf_dir))
    try:
        group.call(TrainEngine.save_checkpoint, ds_dir=ds_dir, tag=ds_partial.name)
        (ds_partial / "oxrl_state.json").write_text(json.dumps({"step": step, **loop_state}))
        group.call(TrainEngine.save_hf, out_dir=hf_partial, tokenizer_dir=tokenizer_dir)
        replaced = []  # the same step's folders saved before (`final` of a resumed run): swapped out, then removed
        for partial, folder in ((ds_partial, ds_dir / tag), (hf_partial, hf_dir)):
            if folder.exists():
                replaced.append(folder.with_name(PARTIAL + "old-" + folder.name))
                os.replace(folder, replaced[-1])
            os.replace(partial, folder)
        (ds_dir / "latest.tmp").write_text(tag)
        os.replace(ds_dir / "latest.tmp", ds_dir / "latest")
        for folder in replaced:
            shutil.rmtree(folder)
    except BaseException as e:
        for partial in (ds_partial, hf_partial):
            shutil.rmtree(partial, ignore_errors=True)
        if not isinstance(e, Exception) or not _disk_full(e, run_dir):
            raise
        latest = ds_dir / "latest"
        kept = latest.read_text().strip() if latest.is_file() else None
        raise OxrlError(
            f"checkpoint of step {step}: no space left on the disk of {run_dir}; "
            + (
                f"the last complete checkpoint ({kept}) is intact: free space and rerun with --resume"
                if kept
                else "no earlier checkpoint exists: free space and run again"
            )
        ) from None
    return hf_dir


def _disk_full(error: BaseException, path: Path) -> bool:
    """Writers report a full disk differently (OSError 28, safetensors' "os error 28", torch's bare "unexpected
    pos" from its zip writer, each possibly inside a Ray task error): the message or errno, else the disk itself."""
    text = str(error)
    if getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in text or "os error 28" in text:
        return True
    return shutil.disk_usage(path).free < 16 * 1024**2


def refuse_overwrite(ds_dir: Path) -> dict:
    if (ds_dir / "latest").is_file():
        raise OxrlError(
            f"run.name: {ds_dir.parent} already holds a run; pass --resume to continue it or choose another run.name"
        )
    return {}
