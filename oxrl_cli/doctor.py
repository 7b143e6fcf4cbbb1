"""`oxrl doctor`: check the environment before a run; a rich table, or JSON for scripts."""

import typer
from rich.console import Console
from rich.table import Table

from oxrl_core.doctor.report import Report

STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def doctor(
    json_output: bool = typer.Option(
        False, "--json", help="Print the report as JSON (schema: oxrl_core.doctor.report.Report)."
    ),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too, not only on failures."),
    deep: bool = typer.Option(False, "--deep", help="Also run a 2-process all-reduce (NCCL with 2+ GPUs, else gloo)."),
    smoke: bool = typer.Option(
        False,
        "--smoke",
        help="Also run one RL step on the built-in tiny model through the whole stack (about a minute on CPU).",
    ),
    timeout: float = typer.Option(
        60.0,
        "--timeout",
        min=1,
        help="Seconds each probe (Ray start, DeepSpeed report, torch on the GPUs, all-reduce) may take.",
    ),
) -> None:
    """Check Python, memory, disks, GPUs, CUDA, packages, DeepSpeed and Ray. Exit 0 when nothing fails, 1 when something does."""
    from oxrl_core.doctor.diagnose import run_checks

    with Console(stderr=True).status("checking the environment..."):
        report = run_checks(deep=deep, smoke=smoke, timeout=timeout)
    if json_output:
        typer.echo(report.model_dump_json(indent=2))
    else:
        render_report(report, Console())
    raise typer.Exit(report.exit_code(strict))


def render_report(report: Report, console: Console) -> None:
    table = Table(title=f"oxrl doctor: {report.status}", title_style=STATUS_STYLE[report.status])
    for column in ("check", "status", "finding", "fix"):
        table.add_column(column, overflow="fold")
    for check in report.checks:
        table.add_row(check.name, f"[{STATUS_STYLE[check.status]}]{check.status}[/]", check.finding, check.fix or "")
    console.print(table)
