"""`oxrl eval`: sample a model (or two, `--compare`) with vLLM on prompt records, score with a reward, report pass@k."""

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from oxrl_core.errors import OxrlError


def eval_command(
    model: str = typer.Option(
        ..., "--model", help="A model folder, a Hub id (org/name) or oxrl-tiny.", show_default=False
    ),
    data: Path = typer.Option(
        ...,
        "--data",
        show_default=False,
        help="Prompt records (.jsonl/.parquet): `prompt` or `messages`, plus what the reward reads.",
    ),
    reward: str = typer.Option(
        ...,
        "--reward",
        show_default=False,
        help="math, gsm8k, format, code, reward-model, or your own module:function.",
    ),
    reward_kwargs: str = typer.Option("{}", "--reward-kwargs", help="Keyword arguments for the reward, a JSON object."),
    n: int = typer.Option(8, "--n", help="Samples per prompt."),
    k: str = typer.Option(
        None, "--k", help="The k of pass@k, comma-separated, each at most --n.  [default: 1,N]", show_default=False
    ),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature; 0 is greedy (with --n 1)."),
    max_tokens: int = typer.Option(512, "--max-tokens", help="New tokens per sample."),
    max_prompt_len: int = typer.Option(1024, "--max-prompt-len", help="Longer prompts are skipped and reported."),
    correct_threshold: float = typer.Option(
        1.0, "--correct-threshold", help="A sample is correct when its reward is at least this."
    ),
    compare: str = typer.Option(
        None,
        "--compare",
        show_default=False,
        help="A second model, evaluated after the first on the same prompts with the same seeds.",
    ),
    out: Path = typer.Option(
        None,
        "--out",
        show_default=False,
        help="Folder for samples.jsonl and summary.json (with --compare: model_a/, model_b/).  "
        "[default: eval/<model>, eval/<model>-vs-<compare>]",
    ),
    seed: int = typer.Option(0, "--seed", help="Seeds every prompt's sampling: reruns and --compare draw alike."),
    gpu_memory_utilization: float = typer.Option(
        0.5, "--gpu-memory-utilization", help="vLLM's share of GPU memory (on CPU: of RAM, for its KV cache)."
    ),
    strict: bool = typer.Option(False, "--strict", help="A bad record is fatal instead of skipped and reported."),
) -> None:
    """Generate n samples per prompt with vLLM, score them with a reward, report pass@k, reward and response lengths."""
    from oxrl_core.evaluation.run import EvalSettings, run_eval

    settings = EvalSettings(
        n=n,
        ks=_ks(k, n),
        temperature=temperature,
        max_tokens=max_tokens,
        max_prompt_len=max_prompt_len,
        seed=seed,
        correct_threshold=correct_threshold,
        gpu_memory_utilization=gpu_memory_utilization,
        strict=strict,
    )
    console = Console()
    summaries = run_eval(
        [model, *([compare] if compare else [])], data, reward, _reward_kwargs(reward_kwargs), settings, out, console
    )
    render_eval(summaries, console)


def _ks(text: str | None, n: int) -> tuple[int, ...]:
    if text is None:
        return tuple(sorted({1, n}))
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise OxrlError(f"--k {text!r}: expected comma-separated whole numbers, e.g. 1,8") from None


def _reward_kwargs(text: str) -> dict:
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as e:
        raise OxrlError(
            f'--reward-kwargs {text!r}: not JSON ({e.msg}); expected an object, e.g. \'{{"path": "rm"}}\''
        ) from None
    if not isinstance(kwargs, dict):
        raise OxrlError(f'--reward-kwargs {text!r}: expected a JSON object, e.g. \'{{"path": "rm"}}\'')
    return kwargs


def render_eval(summaries: list[dict], console: Console) -> None:
    """One column per model; with two, a third with model B minus model A."""
    first, labels = summaries[0], ["model A", "model B"] if len(summaries) == 2 else ["value"]
    s = first["settings"]
    table = Table(
        title=f"oxrl eval: {first['prompts']} prompts x {s['n']} samples, temperature {s['temperature']}, "
        f"reward {first['reward']} (correct: reward >= {s['correct_threshold']})"
    )
    table.add_column("metric")
    for label in labels:
        table.add_column(label, justify="right")
    if len(summaries) == 2:
        table.add_column("difference (B - A)", justify="right")
    for key in first["metrics"]:
        values = [summary["metrics"][key] for summary in summaries]
        diff = [_number(values[1] - values[0], signed=True)] if len(summaries) == 2 else []
        table.add_row(key, *map(_number, values), *diff)
    console.print(table)
    for label, summary in zip(labels if len(summaries) == 2 else ["model"], summaries):  # paths print verbatim
        console.print(f"{label}: {summary['model']} -> {summary['out']}", soft_wrap=True, highlight=False, markup=False)


def _number(x, signed: bool = False) -> str:
    if isinstance(x, int):
        return f"{x:+d}" if signed else str(x)
    return f"{x:+.4f}" if signed else f"{x:.4f}"
