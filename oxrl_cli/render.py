"""Rich rendering of results."""

from rich.console import Console
from rich.table import Table


def render_sl_summary(summary: dict, console: Console) -> None:
    table = Table(title="oxrl train sl: done", show_header=False)
    rows = [
        ("steps", f"{summary['first_step'] - 1} -> {summary['steps']}"),
        ("loss (first -> last step)", _pair(summary["first_loss"], summary["last_loss"])),
        *(
            (f"{key} (before -> after)", _pair(summary.get("eval_before", {}).get(key), value))
            for key, value in summary.get("eval_after", {}).items()
        ),
        ("skipped records", str(summary["skipped_records"])),
        ("wall time", f"{summary['wall_time_s']:.1f} s"),
        ("model", summary.get("checkpoint", "not saved (run.save_final=false)")),
        ("mlflow run", summary["mlflow_run_id"]),
    ]
    _print_rows(table, rows, console)


def render_rl_summary(summary: dict, console: Console) -> None:
    table = Table(title="oxrl train rl: done", show_header=False)
    last = summary["history"][-1] if summary["history"] else {}
    rows = [
        (
            "steps",
            f"{summary['first_step'] - 1} -> {summary['history'][-1]['step'] if summary['history'] else summary['first_step'] - 1}",
        ),
        ("reward (last step)", _num(last.get("reward_mean"))),
        (
            "eval accuracy, sampled (before -> after)",
            _pair(*(summary.get(k, {}).get("eval_accuracy") for k in ("eval_before", "eval_after"))),
        ),
        (
            "eval accuracy, greedy (before -> after)",
            _pair(*(summary.get(k, {}).get("eval_accuracy_greedy") for k in ("eval_before", "eval_after"))),
        ),
        ("reward errors", str(summary.get("reward_errors", 0))),
        ("stopped early", summary.get("stopped_early", "no")),
        ("wall time", f"{summary['wall_time_s']:.1f} s"),
        ("model", summary.get("checkpoint", "not saved (run.save_final=false)")),
        ("mlflow run", summary["mlflow_run_id"]),
    ]
    _print_rows(table, rows, console)


def render_demo(result: dict) -> None:
    console = Console()
    table = Table(title="oxrl demo: oxrl-tiny on synthetic arithmetic", show_header=False)
    rows = [
        ("SFT", f"{result['sft_steps']} steps, eval loss {result['sft_eval_loss']:.4f}"),
        ("CISPO", f"{result['rl_steps']} steps"),
        ("accuracy after SFT (sampled, T=1)", _num(result["after_sft"]["eval_accuracy"])),
        ("accuracy after RL (sampled, T=1)", _num(result["after_rl"]["eval_accuracy"])),
        ("accuracy after SFT (greedy)", _num(result["after_sft"]["eval_accuracy_greedy"])),
        ("accuracy after RL (greedy)", _num(result["after_rl"]["eval_accuracy_greedy"])),
        ("wall time", f"{result['wall_time_s']:.0f} s"),
    ]
    _print_rows(table, rows, console)
    console.print(f"model {result['checkpoint']}", soft_wrap=True, highlight=False)
    console.print(f"curves {result['plot']}", soft_wrap=True, highlight=False)


def _print_rows(table: Table, rows: list[tuple[str, str]], console: Console) -> None:
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


def _num(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def _pair(a, b) -> str:
    return f"{_num(a)} -> {_num(b)}"
