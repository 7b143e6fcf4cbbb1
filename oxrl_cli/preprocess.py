"""`oxrl preprocess`: convert a dataset into oxrl's parquet plus a manifest; a table of counts and the first drops."""

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

SHOWN_DROPS = 5


def preprocess(
    source: str = typer.Argument(
        None,
        show_default=False,
        help="A .jsonl/.json/.csv/.parquet file, a saved `datasets` folder, or a Hub dataset id "
        "(cached, or downloaded when online). Omitted for --format arithmetic.",
    ),
    fmt: str = typer.Option(..., "--format", help="gsm8k, math, openr1, preference, generic or arithmetic."),
    out: Path = typer.Option(..., "--out", help="Output folder: <split>.parquet and <split>.manifest.json go there."),
    split: str = typer.Option(
        "train", "--split", help="The split to read (saved datasets, the Hub); names the output files."
    ),
    mapping: list[str] = typer.Option(
        None, "--map", help="NEW=OLD: rename source column OLD to NEW before converting; repeatable."
    ),
    subset: str = typer.Option(None, "--subset", help="The Hub dataset's configuration (e.g. main for openai/gsm8k)."),
    n: int = typer.Option(None, "--n", help="arithmetic: number of problems (default 512)."),
    seed: int = typer.Option(None, "--seed", help="arithmetic: random seed (default 0)."),
    kind: str = typer.Option(
        None, "--kind", help="arithmetic: rl, sft, preference, kto or text records (default sft)."
    ),
    strict: bool = typer.Option(
        False, "--strict", help="A row that does not convert is an error (exit 2), not a drop."
    ),
) -> None:
    """Convert GSM8K, MATH, OpenR1-Math, preference or any tabular data into oxrl's records (parquet + manifest)."""
    from oxrl_core.preprocess.pipeline import parse_mapping
    from oxrl_core.preprocess.pipeline import preprocess as run_preprocess

    manifest = run_preprocess(
        source,
        fmt,
        out,
        split=split,
        mapping=parse_mapping(mapping or []),
        subset=subset,
        strict=strict,
        n=n,
        seed=seed,
        kind=kind,
    )
    _render(manifest, Console())


def _render(manifest, console: Console) -> None:
    table = Table(title=f"oxrl preprocess: {manifest.format}", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # the hash and long paths wrap instead of being cut
    rows = [
        ("source", manifest.source),
        ("rows read", str(manifest.counts["read"])),
        ("rows written", str(manifest.counts["written"])),
        ("rows dropped", str(manifest.counts["dropped"])),
        ("columns", ", ".join(manifest.schema)),
        ("sha256", manifest.sha256),
    ]
    for key, value in rows:
        table.add_row(key, Text(value))  # Text: a path's brackets are not rich markup
    console.print(table)
    for drop in manifest.dropped[:SHOWN_DROPS]:
        console.print(f"dropped row {drop['row']}: {drop['reason']}", soft_wrap=True, highlight=False, markup=False)
    if len(manifest.dropped) > SHOWN_DROPS:
        console.print(f"... {len(manifest.dropped) - SHOWN_DROPS} more in the manifest", highlight=False)
    manifest_path = Path(manifest.output).with_suffix(".manifest.json")
    console.print(f"wrote {manifest.output}\nwrote {manifest_path}", soft_wrap=True, highlight=False, markup=False)
