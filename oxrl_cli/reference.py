"""The CLI reference (docs/reference/cli.md), generated from the Typer app: a section per command with its help,
usage line and a table of its arguments and options.

    python -m oxrl_cli.reference docs/reference/cli.md   # rewrite the block between the markers
"""

import inspect
import json
import re
import sys
import typing
from pathlib import Path

import typer
from typer.main import get_command

from oxrl_cli.main import app
from oxrl_core.config.reference import rewrite_between_markers
from oxrl_core.config.schema import RLConfig, SLConfig

START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"
DEFAULT_IN_HELP = re.compile(r"\s*\[default: (.+)\]$")  # a default the help text states itself (show_default=False)
TYPES = {bool: "flag", int: "integer", float: "number", str: "text", Path: "path"}


def reference_markdown(app: typer.Typer = app) -> str:
    """The generated block: an index, then `oxrl` itself and every command and sub-command in `oxrl --help`'s order."""
    commands = list(_walk(get_command(app), "oxrl"))
    lines = ["| command | what it does |", "|---|---|"]
    lines += [
        f"| [`{name}`](#{name.replace(' ', '-')}) | {_inline(_first_sentence(command.help))} |"
        for name, command in commands
    ]
    lines.append("")
    for name, command in commands:
        lines += _section(name, command)
    return "\n".join(lines)


def _walk(command, name: str):
    yield name, command
    if hasattr(command, "commands"):  # a group: `oxrl`, `oxrl train`
        ctx = command.context_class(command, info_name=name)
        for sub in command.list_commands(ctx):
            yield from _walk(command.commands[sub], f"{name} {sub}")


def _section(name: str, command) -> list[str]:
    lines = [f"## {name}", "", _inline(command.help or ""), "", "```text", _usage(name, command), "```", ""]
    params = [p for p in command.params if not p.hidden]
    if params:
        config_keys = _config_keys(name) if any(p.name == "config" for p in params) else {}
        annotations = _annotations(command)
        lines += ["| argument or option | type | default | meaning |", "|---|---|---|---|"]
        lines += [_row(p, annotations.get(p.name), config_keys) for p in params]
        lines.append("")
    if hasattr(command, "commands"):
        ctx = command.context_class(command, info_name=name)
        lines += [f"Commands: {', '.join(f'`{name} {sub}`' for sub in command.list_commands(ctx))}.", ""]
    return lines


def _usage(name: str, command) -> str:
    pieces = [name, "[OPTIONS]"] if any(_is_option(p) for p in command.params) else [name]
    for p in command.params:
        if not _is_option(p):
            shown = (p.metavar or p.name).upper() + ("..." if p.nargs == -1 else "")
            pieces.append(shown if p.required else f"[{shown}]")
    if hasattr(command, "commands"):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def _row(p, annotation, config_keys: dict) -> str:
    names = (
        ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
        if _is_option(p)
        else f"`{(p.metavar or p.name).upper()}`"
    )
    help_text = p.help or ""
    stated = DEFAULT_IN_HELP.search(help_text)
    help_text = DEFAULT_IN_HELP.sub("", help_text)
    if p.opts[0] in config_keys:  # the option sets a config key: without it, the config's value holds
        key, field = config_keys[p.opts[0]]
        unset = field.default if isinstance(field.default, str) else json.dumps(field.default)
        kind, default = _type(field.annotation), f"`{key}` of the config (else `{unset}`)"
    else:
        kind = _type(annotation) if annotation is not None else ("flag" if getattr(p, "is_flag", False) else "text")
        default = _default(p, stated, help_text)
    if getattr(p, "min", None) is not None:  # a bounded number (typer keeps the bound on the parameter)
        kind += f" ≥ {p.min}"
    if p.multiple:
        kind += ", repeatable"
    elif p.nargs == -1:
        kind += ", any number"
    return f"| {names} | {kind} | {default} | {_inline(help_text)} |"


def _default(p, stated, help_text: str) -> str:
    if p.required:
        return "required"
    if stated:
        return f"`{stated.group(1)}`"
    if getattr(p, "is_flag", False):
        return "off"
    if p.default is None or p.default == ():
        return "see meaning" if "default" in help_text else "none"
    return f"`{p.default}`"


def _config_keys(name: str) -> dict:
    """`--option` -> (`section.key`, its pydantic field) for the config keys whose description names a CLI option,
    e.g. train.alg's "(CLI: --alg)": the option sets that key, applied after the file and the overrides."""
    config = SLConfig if name.endswith(" sl") else RLConfig
    keys = {}
    for section, info in config.model_fields.items():
        for key, field in getattr(info.annotation, "model_fields", {}).items():
            for option in re.findall(r"\(CLI: (--[\w-]+)\)", field.description or ""):
                keys[option] = (f"{section}.{key}", field)
    return keys


def _annotations(command) -> dict:
    """Parameter name -> Python annotation of the function behind the command (typer keeps it as __wrapped__)."""
    if command.callback is None:
        return {}
    return {name: p.annotation for name, p in inspect.signature(command.callback).parameters.items()}


def _type(annotation) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if typing.get_origin(annotation) is list:
        return _type(typing.get_args(annotation)[0])
    return TYPES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _inline(text: str) -> str:
    """Help text as one table cell or paragraph: whitespace collapsed, pipes and angle brackets escaped."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "\\<")


def _first_sentence(text: str | None) -> str:
    return re.split(r"(?<=\.)\s", (text or "").strip(), maxsplit=1)[0].rstrip(".")


def _is_option(p) -> bool:
    return p.param_type_name == "option"


def rewrite(path: Path) -> None:
    rewrite_between_markers(path, START, END, reference_markdown())


if __name__ == "__main__":
    rewrite(Path(sys.argv[1]))
