"""`oxrl preprocess`: read a source, rename columns, convert and check each row, write parquet and a manifest.

The output, <out>/<split>.parquet, loads with oxrl's own readers (read_records reads
parquet). The manifest beside it, <out>/<split>.manifest.json, records where the rows
came from, how many were read, written and dropped, every dropped row with its
reason, the output's schema, and a content hash: sha256 over the written rows as
canonical JSON lines (keys sorted, no spaces, UTF-8, one row per line, in order), the
rows as a reader sees them, so the same data gives the same hash whatever file held it.
"""

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from oxrl_core.data.records import DataProblem, check_problems
from oxrl_core.errors import OxrlError
from oxrl_core.preprocess.arithmetic import (
    arithmetic_problems,
    preference_records,
    sft_records,
    text_records,
    unpaired_records,
)
from oxrl_core.preprocess.converters import CONVERTERS
from oxrl_core.preprocess.media import check_media, media_fields
from oxrl_core.preprocess.sources import Source, read_source

FORMATS = (*CONVERTERS, "arithmetic")
ARITHMETIC_KINDS = ("rl", "sft", "preference", "kto", "text")
SPLIT_NAME = re.compile(r"[\w.-]+")


@dataclass
class Manifest:
    source: str  # a path, a Hub id, or the arithmetic generator's settings
    subset: str | None
    split: str
    format: str
    mapping: dict[str, str]  # new column name -> source column name
    output: str  # the parquet file
    counts: dict[str, int]  # read (source rows), written (output rows; an OpenR1 row gives one per kept trace), dropped
    sha256: str  # content hash of the written rows (see the module docstring)
    schema: dict[str, str]  # output column -> its Arrow type
    dropped: list[dict]  # {row: 1-based line or row number in the source, reason}


def preprocess(
    source: str | None,
    fmt: str,
    out: Path,
    split: str = "train",
    mapping: dict[str, str] | None = None,
    subset: str | None = None,
    strict: bool = False,
    n: int | None = None,
    seed: int | None = None,
    kind: str | None = None,
) -> Manifest:
    """Convert `source` in format `fmt` (or generate arithmetic rows) into <out>/<split>.parquet and its manifest.

    Rows that do not convert are dropped and listed in the manifest; with `strict`
    the first is an OxrlError and nothing is written. `n`, `seed` and `kind` are the
    arithmetic generator's (defaults 512, 0, sft; kind: one of ARITHMETIC_KINDS).
    """
    mapping = mapping or {}
    if fmt not in FORMATS:
        raise OxrlError(f"--format {fmt!r}: unknown; allowed: {', '.join(FORMATS)}")
    if not SPLIT_NAME.fullmatch(split):
        raise OxrlError(
            f"--split {split!r}: it names the output file <split>.parquet; use letters, digits, '_', '-', '.'"
        )
    if fmt == "arithmetic":
        if source is not None or mapping or subset is not None:
            raise OxrlError("--format arithmetic generates its rows: give no SOURCE, --map or --subset")
        n, seed, kind = 512 if n is None else n, 0 if seed is None else seed, kind or "sft"
        rows = arithmetic_rows(n, seed, kind)
        name, read, dropped = f"arithmetic(n={n}, seed={seed}, kind={kind})", len(rows), []
    else:
        given = [f"--{k}" for k, v in (("n", n), ("seed", seed), ("kind", kind)) if v is not None]
        if given:
            raise OxrlError(f"{', '.join(given)}: only for --format arithmetic, not --format {fmt}")
        if source is None:
            raise OxrlError(
                f"--format {fmt}: give a SOURCE: a .jsonl/.json/.csv/.parquet file, a saved dataset folder or a Hub dataset id"
            )
        data = read_source(source, split, subset)
        name = data.name
        rows, read, dropped = convert_rows(data, fmt, mapping)
    check_problems(name, rows, dropped, strict, fmt)
    table = rows_table(rows)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    output = out / f"{split}.parquet"
    pq.write_table(table, output)
    manifest = Manifest(
        source=name,
        subset=subset,
        split=split,
        format=fmt,
        mapping=mapping,
        output=str(output),
        counts={"read": read, "written": table.num_rows, "dropped": len(dropped)},
        sha256=content_hash(table.to_pylist()),  # the rows as a reader sees them: missing keys are null
        schema={field.name: str(field.type) for field in table.schema},
        dropped=[{"row": p.line, "reason": p.reason} for p in dropped],
    )
    (out / f"{split}.manifest.json").write_text(json.dumps(asdict(manifest), indent=2, ensure_ascii=False) + "\n")
    return manifest


def parse_mapping(items: list[str]) -> dict[str, str]:
    """`--map NEW=OLD` arguments as {new: old}."""
    mapping = {}
    for item in items:
        new, sep, old = item.partition("=")
        if not sep or not new.strip() or not old.strip():
            raise OxrlError(f"--map {item!r}: expected NEW=OLD, e.g. --map prompt=question")
        if new.strip() in mapping:
            raise OxrlError(f"--map {item!r}: {new.strip()!r} is already mapped (to {mapping[new.strip()]!r})")
        mapping[new.strip()] = old.strip()
    return mapping


def rename_columns(record: dict, mapping: dict[str, str]) -> dict:
    """`record` with each source column `old` renamed `new`; a mapped name replaces a source column of that name."""
    renamed = {new: record.get(old) for new, old in mapping.items()}
    kept = {k: v for k, v in record.items() if k not in mapping and k not in mapping.values()}
    return {**kept, **renamed}


def convert_rows(source: Source, fmt: str, mapping: dict[str, str]) -> tuple[list[dict], int, list[DataProblem]]:
    """(output rows, source rows read, dropped rows sorted by row number) of one source."""
    unknown = [f"{new}={old}" for new, old in mapping.items() if old not in source.columns]
    if unknown:
        raise OxrlError(
            f"--map {', '.join(unknown)}: no such column in {source.name}; "
            f"its columns: {', '.join(source.columns) or 'none'}"
        )
    convert = CONVERTERS[fmt]
    rows, dropped, read = [], list(source.problems), len(source.problems)
    for number, record in source.rows:
        read += 1
        record = rename_columns(record, mapping)
        media = media_fields(record)  # kept whatever the format: a multimodal record keeps its media
        try:
            check_media(media)
            converted = convert(record)
        except ValueError as e:
            dropped.append(DataProblem(source.name, number, str(e)))
            continue
        rows += [{**row, **media} for row in (converted if isinstance(converted, list) else [converted])]
    dropped.sort(key=lambda p: p.line)
    return rows, read, dropped


def arithmetic_rows(n: int, seed: int, kind: str) -> list[dict]:
    """`n` synthetic arithmetic records of one kind; the same for the same seed."""
    if n < 1:
        raise OxrlError(f"--n {n}: the number of problems must be at least 1")
    problems = arithmetic_problems(n, seed)
    if kind == "rl":
        return problems
    if kind == "sft":
        return sft_records(problems)
    if kind == "preference":
        return preference_records(problems, seed)
    if kind == "kto":
        return unpaired_records(problems, seed)
    if kind == "text":
        return text_records(problems)
    raise OxrlError(f"--kind {kind!r}: unknown; allowed: {', '.join(ARITHMETIC_KINDS)}")


def content_hash(rows: list[dict]) -> str:
    """sha256 of rows as canonical JSON lines; values JSON lacks (bytes, dates) count by their str."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(
            json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode() + b"\n"
        )
    return digest.hexdigest()


def rows_table(rows: list[dict]) -> pa.Table:
    """A pyarrow Table of the rows: a column for every key any row has, null where a row lacks it."""
    columns = {}
    for name in dict.fromkeys(key for row in rows for key in row):
        values = [row.get(name) for row in rows]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            types = ", ".join(sorted({type(v).__name__ for v in values if v is not None}))
            raise OxrlError(
                f"column {name!r}: its values ({types}) do not make one parquet column "
                f"({str(e).splitlines()[0]}); give it one type in every row"
            ) from None
    return pa.table(columns)
