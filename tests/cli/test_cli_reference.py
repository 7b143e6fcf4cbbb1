"""docs/reference/cli.md stays true: its generated block is the Typer app's, and a new command or option shows."""

from pathlib import Path

import typer
from typer.main import get_command
from typer.models import CommandInfo

from oxrl_cli.main import app
from oxrl_cli.reference import END, START, reference_markdown

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "cli.md"
REGENERATE = "stale: run python -m oxrl_cli.reference docs/reference/cli.md"


def _block() -> str:
    return PAGE.read_text().split(START)[1].split(END)[0].strip()


def _commands(command, name="oxrl"):
    yield name, command
    for sub, child in getattr(command, "commands", {}).items():
        yield from _commands(child, f"{name} {sub}")


def test_the_generated_block_is_current():
    assert _block() == reference_markdown().strip(), REGENERATE


def test_every_command_and_option_of_the_app_is_on_the_page():
    block = _block()
    commands = dict(_commands(get_command(app)))
    assert {
        "oxrl train sl",
        "oxrl train rl",
        "oxrl demo",
        "oxrl doctor",
        "oxrl onboard",
        "oxrl eval",
        "oxrl preprocess",
        "oxrl merge-lora",
        "oxrl report",
    } <= set(commands)
    missing = [name for name in commands if f"\n## {name}\n" not in block]
    assert not missing, (missing, REGENERATE)
    sections = {name: block.split(f"\n## {name}\n")[1].split("\n## ")[0] for name in commands}
    for name, command in commands.items():
        for param in command.params:
            for opt in param.opts if param.param_type_name == "option" else [param.name.upper()]:
                assert f"`{opt}`" in sections[name], (name, opt, REGENERATE)


def test_alg_defaults_to_the_configs_train_alg():
    block = _block()
    for kind, fallback in (("sl", "sft"), ("rl", "cispo")):
        row = next(
            line for line in block.split(f"\n## oxrl train {kind}\n")[1].splitlines() if line.startswith("| `--alg`")
        )
        assert f"`train.alg` of the config (else `{fallback}`)" in row


def test_a_new_command_or_option_changes_the_block(monkeypatch):
    """What the staleness check rests on: the generator reads the app, so an addition shows up in its output."""

    def demo(
        seed: int = typer.Option(0, "--seed"), fast: bool = typer.Option(False, "--fast", help="Fewer steps.")
    ) -> None:
        """The demo, with an option added."""

    def fresh(path: Path = typer.Argument(..., help="Somewhere.")) -> None:
        """A command added without regenerating."""

    commands = [
        CommandInfo(callback=demo) if info.callback.__name__ == "demo" else info for info in app.registered_commands
    ]
    monkeypatch.setattr(app, "registered_commands", [*commands, CommandInfo(name="fresh", callback=fresh)])
    changed = reference_markdown(app)
    assert changed.strip() != _block()
    assert "\n## oxrl fresh\n" in changed and "| `PATH` | path | required | Somewhere. |" in changed
    assert "| `--fast` | flag | off | Fewer steps. |" in changed
