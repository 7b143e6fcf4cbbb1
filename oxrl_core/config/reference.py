"""The config reference (docs/reference/config.md), generated from the pydantic models.

python -m oxrl_core.config.reference docs/reference/config.md   # rewrite the block between the markers
"""

import json
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from oxrl_core.algs.settings import Settings
from oxrl_core.config.schema import RLConfig, SLConfig

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def reference_markdown() -> str:
    sl_sections = set(SLConfig.model_fields)
    lines = []
    for section, field in RLConfig.model_fields.items():
        # train differs between SL and RL; every other section is shared or RL-only
        variants = (
            [("sl", SLConfig.model_fields[section].annotation), ("rl", field.annotation)]
            if section == "train"
            else [(None, field.annotation)]
        )
        for kind, model in variants:
            where = f" ({kind} runs)" if kind else ("" if section in sl_sections else " (rl runs)")
            lines += [f"## `{section}`{where}", "", *_table(_rows(section, model)), ""]
            if section == "train":
                lines += _algorithm_blocks(model)
    return "\n".join(lines)


def _algorithm_blocks(train: type[BaseModel]) -> list[str]:
    """A section per algorithm of the loop: its own settings, `train.<alg>`, declared in its file."""
    from oxrl_core.algs.registry import ALGORITHMS

    lines = []
    for field in train.model_fields.values():
        if field.alias is None:
            continue
        settings = ALGORITHMS[field.alias].settings
        lines += [f"### `train.{field.alias}`", ""]
        if settings.__doc__ and settings.__doc__ != Settings.__doc__:
            lines += [" ".join(settings.__doc__.split()), ""]
        rows = _rows(f"train.{field.alias}", settings)
        lines += [*_table(rows), ""] if rows else ["No settings of its own.", ""]
        lines += [f"Fixed by its definition: `{key}` ({why})." for key, why in settings.fixed.items()]
        lines += [""] if settings.fixed else []
    return lines


def _table(rows: list[str]) -> list[str]:
    return ["| key | type | default | meaning |", "|---|---|---|---|", *rows]


def _rows(prefix: str, model: type[BaseModel]) -> list[str]:
    """A row per field; a nested section (e.g. reward.judge) gets a row per field of its own."""
    rows = []
    for name, sub in model.model_fields.items():
        if sub.alias is not None:  # an algorithm's block: a section of its own (`_algorithm_blocks`)
            continue
        if isinstance(sub.annotation, type) and issubclass(sub.annotation, BaseModel):
            rows += _rows(f"{prefix}.{name}", sub.annotation)
        else:
            rows.append(f"| `{prefix}.{name}` | {_type(sub.annotation)} | {_default(sub)} | {sub.description or ''} |")
    return rows


def _type(annotation) -> str:
    args = typing.get_args(annotation)
    if (
        typing.get_origin(annotation) is typing.Annotated
    ):  # a constrained type (PositiveInt): the constraint is in the meaning
        return _type(args[0])
    if typing.get_origin(annotation) is list and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return "list of {" + ", ".join(args[0].model_fields) + "}"
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " \\| ".join("None" if a is type(None) else _type(a) for a in args)
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return "section" if issubclass(annotation, BaseModel) else annotation.__name__
    return str(annotation).replace("pathlib.", "").replace("typing.", "").replace("|", "\\|")


def _default(field) -> str:
    if field.default_factory is not None:
        return "(see meaning)"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{json.dumps(field.default)}`"


def rewrite_between_markers(page: Path, start: str, end: str, block: str) -> None:
    """Replace what lies between a page's two markers with `block` (the generated references' pages)."""
    head, _, rest = page.read_text().partition(start)
    _, _, tail = rest.partition(end)
    page.write_text(f"{head}{start}\n{block}\n{end}{tail}")


def rewrite(page: Path) -> None:
    rewrite_between_markers(page, START, END, reference_markdown())


if __name__ == "__main__":
    rewrite(Path(sys.argv[1]))
