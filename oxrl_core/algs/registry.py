"""Every algorithm: its name (what users type, --alg NAME), the loop it runs in, and the module that declares its
record (`ALGORITHM`, see `base.py`) and its settings (`settings.py`).

Adding an algorithm is adding its file and its line here; the config's allowed names and `train.<alg>` blocks, the
CLI's `--alg` choices and the loops' behaviour all come from the records. The names are listed, not imported: the
config schema's names and every `oxrl` command's `--alg` choices need them, and importing an algorithm imports torch
(seconds). `ALGORITHMS`, the records themselves, imports the modules on first use.
"""

import importlib
from functools import cache

DECLARED: dict[str, tuple[str, str]] = {  # name: (loop, module); each loop's default first
    "sft": ("sl", "oxrl_core.algs.sft"),
    "cpt": ("sl", "oxrl_core.algs.cpt"),
    "dpo": ("sl", "oxrl_core.algs.dpo"),
    "ipo": ("sl", "oxrl_core.algs.ipo"),
    "kd": ("sl", "oxrl_core.algs.kd"),
    "kto": ("sl", "oxrl_core.algs.kto"),
    "online-dpo": ("sl", "oxrl_core.algs.online_dpo"),
    "orpo": ("sl", "oxrl_core.algs.orpo"),
    "rft": ("sl", "oxrl_core.algs.rft"),
    "rm": ("sl", "oxrl_core.algs.rm"),
    "simpo": ("sl", "oxrl_core.algs.simpo"),
    "spin": ("sl", "oxrl_core.algs.spin"),
    "cispo": ("rl", "oxrl_core.algs.cispo"),
    "dapo": ("rl", "oxrl_core.algs.dapo"),
    "dr-grpo": ("rl", "oxrl_core.algs.dr_grpo"),
    "grpo": ("rl", "oxrl_core.algs.grpo"),
    "gspo": ("rl", "oxrl_core.algs.gspo"),
    "gspo-token": ("rl", "oxrl_core.algs.gspo_token"),
    "ppo": ("rl", "oxrl_core.algs.ppo"),
    "reinforce++": ("rl", "oxrl_core.algs.reinforce_pp"),
    "reinforce++-baseline": ("rl", "oxrl_core.algs.reinforce_pp_baseline"),
    "rloo": ("rl", "oxrl_core.algs.rloo"),
    "sgrpo": ("rl", "oxrl_core.algs.sgrpo"),
}


def names(loop: str) -> tuple[str, ...]:
    """One loop's algorithm names, its default first."""
    return tuple(name for name, (its_loop, _) in DECLARED.items() if its_loop == loop)


@cache
def _records() -> dict:
    """{name: Algorithm}, importing each declaring module; a record must carry the name it is listed under."""
    records = {name: importlib.import_module(module).ALGORITHM for name, (_, module) in DECLARED.items()}
    for name, record in records.items():
        assert record.name == name and record.loop == DECLARED[name][0], f"{DECLARED[name][1]} declares {record.name!r}"
    return records


def taking(key: str, loop: str | None = None) -> list[str]:
    """The algorithms (of `loop`, or of both) whose settings have `key`: where a refused or moved key belongs."""
    return [
        name
        for name, record in _records().items()
        if key in record.settings.model_fields and loop in (None, record.loop)
    ]


def __getattr__(name: str):
    if name == "ALGORITHMS":
        return _records()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SL_ALGS, RL_ALGS = names("sl"), names("rl")
