"""Progress when stdout is not a terminal: plain lines, not a bar that shows nothing until the end."""

import io

from rich.console import Console

from oxrl_core.tracking import console as progress_module
from oxrl_core.tracking.console import training_progress


def test_off_a_terminal_a_line_comes_at_the_first_step_every_30_s_and_at_the_last(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    with training_progress(Console(file=out, force_terminal=False, width=200)) as progress:
        task = progress.add_task("cispo", total=10, completed=0, loss=float("nan"), tok_s=0.0)
        for step in range(1, 11):
            now[0] += 12.0  # 12 s a step: lines at steps 1, 4 (36 s after 1), 7, 10 (the last)
            progress.update(task, completed=step, loss=0.5 / step, tok_s=1234.5)
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1/10", "4/10", "7/10", "10/10"]
    assert lines[0] == "step 1/10  loss 0.5000  1,234 tok/s  elapsed 0:00:12  ETA 0:01:48"
    assert lines[-1].endswith("elapsed 0:02:00  ETA 0:00:00")


def test_on_a_terminal_it_is_rich_s_bar():
    assert type(training_progress(Console(file=io.StringIO(), force_terminal=True))).__name__ == "Progress"
