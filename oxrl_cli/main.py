"""The `oxrl` command: parse, call oxrl_core, render with rich. No training logic here."""

import os
import shlex
import sys

import typer
from rich.console import Console

from oxrl_cli.doctor import doctor
from oxrl_cli.eval import eval_command
from oxrl_cli.merge_lora import merge_lora
from oxrl_cli.onboard import onboard
from oxrl_cli.preprocess import preprocess
from oxrl_cli.report import report
from oxrl_cli.train import train_app
from oxrl_core.errors import Hang, OxrlError
from oxrl_core.loops.signals import Stopped
from oxrl_core.version import __version__

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
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    pass


@app.command()
def demo(seed: int = typer.Option(0, "--seed", help="Draws the problems, the data order and the samples.")) -> None:
    """Run the embedded demo: build the tiny model, SFT it on synthetic arithmetic, then CISPO; report before/after."""
    from oxrl_cli.render import render_demo
    from oxrl_core.demo import run_demo

    render_demo(run_demo(Console(), seed))


app.command("doctor")(doctor)
app.command("onboard")(onboard)
app.command("merge-lora")(merge_lora)
app.command("eval")(eval_command)
app.command("preprocess")(preprocess)
app.command("report")(report)


def main() -> None:
    """Console-script entry: a user mistake is one line on stderr and exit code 2; a run stopped by a signal says
    how to continue and exits with the signal's code (143 SIGTERM, 130 SIGINT); a hung run names who was stuck and how
    to continue, and exits 1."""
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # its store migrations log at INFO
    try:
        app()
    except OxrlError as e:
        err_console.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except Stopped as e:
        err_console.print(f"{e}; {_again(e.resumable)}", highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except Hang as e:
        err_console.print(f"[red]{e}[/]. Stacks: {e.stacks}; {_again(e.resumable)}", highlight=False, soft_wrap=True)
        sys.exit(1)


def _again(resumable: bool) -> str:
    """How to go on after a stop: this command with --resume, or from the start where no checkpoint was written."""
    command = shlex.join(["oxrl", *(a for a in sys.argv[1:] if a != "--resume")])
    return f"to continue: {command} --resume" if resumable else f"nothing to resume; to start: {command}"
