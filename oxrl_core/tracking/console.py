"""The progress bar every training loop shows."""

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def training_progress(console: Console) -> Progress:
    """Columns: step, bar, loss, tokens/s, elapsed, ETA. Update with fields `loss` and `tok_s`."""
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
