"""The Python API: the CLI's configs and loops, called from Python.

    from oxrl_core import Trainer

    trainer = Trainer(model="Qwen/Qwen2.5-0.5B-Instruct", lora={"enabled": True})
    trainer.train(task="reasoning")                          # RL (CISPO) with the math reward
    trainer.train(alg="dpo", data="prefs.jsonl", steps=200)  # any algorithm of `oxrl train sl|rl`

Sections are the config file's (README: config reference) given as dicts; they are
validated and checked exactly as a YAML file is, before anything starts (`resolve_run`).
What the machine has decides the defaults a config file would spell out: how many
DeepSpeed ranks, and on GPUs where vLLM goes.
"""

import os
from pathlib import Path

from rich.console import Console

from oxrl_core.algs.registry import RL_ALGS, SL_ALGS
from oxrl_core.errors import OxrlError
from oxrl_core.loops.train import train
from oxrl_core.preprocess.arithmetic import arithmetic_problems, write_jsonl
from oxrl_core.resolve.run import merged, resolve_run

TASKS = {"reasoning": "RL with a verifiable math reward (`reward.func: math`); without `data`, on synthetic arithmetic"}


class Trainer:
    def __init__(self, model: str = "oxrl-tiny", **sections: dict):
        """`model`: a local folder, a Hub id or `oxrl-tiny`; `sections`: config sections (lora, deepspeed, run, ...)
        shared by every `train` call."""
        self.sections = merged({"model": {"name_or_path": model}}, sections)

    def train(
        self,
        alg: str | None = None,
        data: str | Path | list | None = None,
        task: str | None = None,
        steps: int | None = None,
        console: Console | None = None,
        **sections: dict,
    ) -> dict:
        """Run one training and return its summary (the run folder's summary.json: metrics, checkpoint path).

        `alg`: any of `oxrl train sl` or `oxrl train rl`; `task="reasoning"` means RL (CISPO unless `alg` says
        otherwise) with the math reward. `data`: a file or a list of files (mixed equally), the same records
        the CLI reads. Keyword sections override the Trainer's for this run.
        """
        if task is not None and task not in TASKS:
            raise OxrlError(f"task={task!r}: not a task; allowed: {', '.join(TASKS)}")
        if alg is None:
            alg = "cispo" if task == "reasoning" else "sft"
        if alg not in SL_ALGS + RL_ALGS:
            raise OxrlError(f"alg={alg!r}: allowed: {', '.join(SL_ALGS + RL_ALGS)}")
        rl = alg in RL_ALGS
        if task == "reasoning" and not rl:
            raise OxrlError(f"task='reasoning' is RL: alg must be one of {', '.join(RL_ALGS)}, got {alg!r}")
        if data is None:
            if task != "reasoning":
                raise OxrlError("data: give a data file (or task='reasoning' for the built-in synthetic arithmetic)")
            data = write_jsonl(
                arithmetic_problems(2000, seed=2, max_operand=9),
                Path(os.environ.get("OXRL_DATA_DIR", "data")) / "arithmetic" / "rl_train.jsonl",
            )
        files = data if isinstance(data, list) else [data]
        run = {
            "train": {"alg": alg, **({"steps": steps} if steps is not None else {})},
            "data": {"train": [{"path": str(f)} for f in files]},
        }
        if task == "reasoning":
            run["reward"] = {"func": "math"}
        tree = merged(merged(self.sections, run), sections)
        resolved = resolve_run("rl" if rl else "sl", sections=tree, machine_defaults=True)
        return train(resolved, resume=False, console=console or Console())
