"""Every algorithm: the `ALGORITHM` record of each module in this package that declares one.

Adding an algorithm is adding its file (`base.py` says what the record holds); the config's allowed names, the CLI's
`--alg` choices and the loops' behaviour all come from the records. Names travel to Ray actors; records are looked
up here on both sides.

The names and loops (`SL_ALGS`, `RL_ALGS`) are read from the files' source, `ALGORITHM = Algorithm("name", "loop",
...)`, without importing them: the config schema and every `oxrl` command need the names, and importing the losses
imports torch (seconds). `ALGORITHMS`, the records themselves, imports the modules on first use.
"""

import ast
import importlib
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent


def _declared() -> dict[str, str]:
    """{name: loop} of every `ALGORITHM = Algorithm(name, loop, ...)` in this package, in file order."""
    declared = {}
    for path in sorted(HERE.glob("[!_]*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["ALGORITHM"]:
                name, loop = (arg.value for arg in node.value.args[:2])
                declared[name] = loop
    return declared


@cache
def _records() -> dict:
    """{name: Algorithm}, importing every module of the package that declares one."""
    modules = [importlib.import_module(f"{__package__}.{path.stem}") for path in sorted(HERE.glob("[!_]*.py"))]
    return {m.ALGORITHM.name: m.ALGORITHM for m in modules if hasattr(m, "ALGORITHM")}


def __getattr__(name: str):
    if name == "ALGORITHMS":
        return _records()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_LOOPS = _declared()
# Each loop's names, its default first, then alphabetical.
SL_ALGS = tuple(sorted((n for n, loop in _LOOPS.items() if loop == "sl"), key=lambda n: (n != "sft", n)))
RL_ALGS = tuple(sorted((n for n, loop in _LOOPS.items() if loop == "rl"), key=lambda n: (n != "cispo", n)))
