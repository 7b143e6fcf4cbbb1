"""The progress every training loop shows: a bar on a terminal, plain lines in a log file or pipe."""

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

PLAIN_LINE_EVERY_S = 30.0


def training_progress(console: Console) -> "Progress | PlainProgress":
    """Columns: step, bar, loss, tokens/s, elapsed, ETA. Update with fields `loss` and `tok_s`. When the output is
    not a terminal (CI, nohup, a log file) a bar would print nothing until the end: plain lines instead."""
    if not console.is_terminal:
        return PlainProgress(console)
    return Progress(
        TextColumn("[bold]step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TextColumn("{task.fields[tok_s]:,.0f} tok/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )


class PlainProgress:
    """`Progress`'s add_task/update for one task, printing `step k/N  loss  tok/s  elapsed  ETA` at the first step,
    then once PLAIN_LINE_EVERY_S have passed since the last line, and at the last step."""

    def __init__(self, console: Console):
        self.console = console

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def add_task(self, description: str, total: int, completed: int = 0, **fields) -> int:
        self.total, self.first, self.start, self.last_line = total, completed, time.monotonic(), None
        return 0

    def update(self, task: int, completed: int, loss: float, tok_s: float) -> None:
        now = time.monotonic()
        if self.last_line is not None and now - self.last_line < PLAIN_LINE_EVERY_S and completed < self.total:
            return
        self.last_line = now
        elapsed = now - self.start
        eta = elapsed / max(completed - self.first, 1) * (self.total - completed)
        self.console.print(
            f"step {completed}/{self.total}  loss {loss:.4f}  {tok_s:,.0f} tok/s  "
            f"elapsed {_clock(elapsed)}  ETA {_clock(eta)}",
            highlight=False,
            soft_wrap=True,
        )


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
