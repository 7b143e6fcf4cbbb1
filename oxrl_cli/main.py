"""The `oxrl` command: parse, call oxrl_core, render with rich. No training logic here."""

import os
import sys

import typer
from rich.console import Console

from oxrl_cli.doctor import doctor
from oxrl_cli.onboard import onboard
from oxrl_cli.train import train_app
from oxrl_core import __version__
from oxrl_core.errors import OxrlError

app = typer.Typer(
    name="oxrl",
    help="Readable post-training for LLMs: SFT, preference and RL algorithms on DeepSpeed, vLLM and Ray.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(train_app, name="train")
err_console = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"oxrl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit.")) -> None:
    pass


@app.command()
def demo() -> None:
    """Run the embedded demo: build the tiny model, SFT it on synthetic arithmetic, report before/after."""
    from oxrl_cli.render import render_demo
    from oxrl_core.demo import run_demo

    render_demo(run_demo(Console()))


app.command("doctor")(doctor)
app.command("onboard")(onboard)


NOT_BUILT = {
    "merge-lora": ("Merge a LoRA adapter into its base model.", 5),
    "preprocess": ("Convert datasets (GSM8K, MATH, preference, ...) into oxrl's format.", 5),
    "eval": ("Generate with vLLM, score, and report pass@k.", 5),
}


def _not_built(name: str, issue: int):
    def command(ctx: typer.Context) -> None:
        err_console.print(f"oxrl {name}: not built yet (tracked in issue #{issue})")
        raise typer.Exit(2)

    return command


for _name, (_help, _issue) in NOT_BUILT.items():
    app.command(_name, help=f"{_help} [not built yet]",
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(_not_built(_name, _issue))


def main() -> None:
    """Console-script entry: a user mistake is one line on stderr and exit code 2."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # its store migrations log at INFO
    try:
        app()
    except OxrlError as e:
        err_console.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
