"""`oxrl report`: a failed run's crash.json as a ready issue body; optionally opened on GitHub."""

import os
from pathlib import Path

import typer
from rich.console import Console


def report(
    run_dir: Path = typer.Argument(..., help="The failed run's folder (holds crash.json).", show_default=False),
    submit: str = typer.Option(
        None,
        "--submit",
        metavar="OWNER/REPO",
        show_default=False,
        help="Open the issue in this GitHub repository, with the token in GITHUB_TOKEN "
        "(GITHUB_API_URL for a GitHub Enterprise server's API).",
    ),
) -> None:
    """Print a bug report for a failed run (Markdown: what failed where, versions, GPUs, config, traceback, each actor's
    last log lines; secrets and your home folder's path redacted) and keep it as RUN_DIR/issue.md."""
    from oxrl_core.errors import OxrlError
    from oxrl_core.tracking.issue import issue_from_crash, submit_issue

    title, body = issue_from_crash(run_dir, Path.home())
    (run_dir / "issue.md").write_text(f"# {title}\n\n{body}\n")
    typer.echo(f"# {title}\n\n{body}")
    if submit is None:
        return
    token = os.environ.get("GITHUB_TOKEN")
    if not token:
        raise OxrlError(
            f"--submit {submit}: GITHUB_TOKEN is not set (a token that may open issues there); the "
            f"report is in {run_dir / 'issue.md'}"
        )
    try:
        url = submit_issue(submit, title, body, token, os.environ.get("GITHUB_API_URL", "https://api.github.com"))
    except OxrlError as e:
        raise OxrlError(f"{e}; the report is in {run_dir / 'issue.md'}") from None
    Console(stderr=True).print(f"opened {url}", highlight=False, soft_wrap=True)
