"""`oxrl merge-lora`: merge a PEFT LoRA adapter into its base; a folder that transformers and vLLM load."""

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text


def merge_lora(
    adapter: Path = typer.Argument(
        ...,
        help="A PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors), "
        "e.g. <run>/final of a LoRA run.",
        show_default=False,
    ),
    out: Path = typer.Option(
        ..., "--out", help="Where the merged model goes: a new or empty folder.", show_default=False
    ),
    base: str = typer.Option(
        None,
        "--base",
        help="The base model (folder or Hub id); default: the adapter's base_model_name_or_path.",
        show_default=False,
    ),
    dtype: str = typer.Option(
        "auto", "--dtype", help="Dtype of the written weights: auto (the base's), float32, bfloat16 or float16."
    ),
    max_shard_size: str = typer.Option("2GB", "--max-shard-size", help="Largest safetensors shard, e.g. 2GB or 500MB."),
    atol: float = typer.Option(
        1e-4, "--atol", min=0.0, help="Largest allowed |merged - adapter-applied| logit difference (float32)."
    ),
    no_check: bool = typer.Option(
        False, "--no-check", help="Skip the logits check (two forwards on a few short sequences)."
    ),
) -> None:
    """Merge a LoRA adapter into its base model: safetensors shards and the tokenizer, checked against the adapter-applied logits."""
    from oxrl_core.models.merge import merge_adapter

    console = Console()
    with Console(stderr=True).status("merging..."):
        report = merge_adapter(adapter, out, base, dtype, max_shard_size, atol, check=not no_check)
    table = Table(title="oxrl merge-lora", show_header=False)
    rows = [
        ("adapter", f"{report.adapter} ({report.task_type}, {report.lora_layers} LoRA layers)"),
        ("base", report.base),
        (
            "check",
            "skipped (--no-check)"
            if report.max_logit_diff is None
            else f"max |merged - adapter-applied| logit = {report.max_logit_diff:.2g} <= {atol:g}",
        ),
        ("dtype", report.dtype),
        ("tokenizer from", report.tokenizer_from),
        ("written", f"{report.out}: {', '.join(report.files)}"),
    ]
    for key, value in rows:
        table.add_row(key, Text(value))  # paths print verbatim, never as markup
    console.print(table)
