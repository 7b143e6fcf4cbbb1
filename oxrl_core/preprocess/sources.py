"""Reading a preprocess source: a local file, a saved `datasets` folder, or a `datasets.load_dataset` path or Hub id.

Every row keeps its 1-based number (the line of a JSON-lines or CSV file, the row of
a parquet file, a JSON array or a dataset), so a dropped row can be found again.
"""

import csv
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from oxrl_core.data.records import DataProblem, read_records
from oxrl_core.errors import OxrlError

FILE_TYPES = (".jsonl", ".json", ".csv", ".parquet")


@dataclass
class Source:
    name: str  # as given: a path or a Hub id
    columns: list[str]  # every column any row has, in first-seen order
    rows: Iterable[tuple[int, dict]]  # (row number, record); a dataset's rows are read as they are iterated
    problems: list[DataProblem]  # rows that are not records (malformed JSON, a CSV row with extra cells)


def read_source(source: str, split: str, subset: str | None) -> Source:
    """The rows of `source`: a .jsonl/.json/.csv/.parquet file, a `save_to_disk` folder, else `datasets.load_dataset(source)`.

    `split` picks the split of a saved DatasetDict or of load_dataset; `subset` is
    load_dataset's configuration name (GSM8K's `main`, for example).
    """
    path = Path(source)
    if path.suffix in FILE_TYPES and not path.is_dir():
        if not path.is_file():
            raise OxrlError(f"{source}: no such file")
        if subset is not None:
            raise OxrlError(
                f"--subset {subset!r}: a file has no subsets; --subset names a configuration of a Hub dataset"
            )
        return _read_file(path)
    if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
        import datasets

        return _from_dataset(source, _pick_split(datasets.load_from_disk(str(path)), split, source))
    return _from_dataset(source, _load_dataset(source, split, subset))


def _read_file(path: Path) -> Source:
    if path.suffix == ".csv":
        return _read_csv(path)
    if path.suffix == ".json" and _starts_with_bracket(path):
        return _read_json_array(path)
    records, problems = read_records(path)  # JSON lines and parquet
    return Source(str(path), _columns(record for _, record in records), records, problems)


def _starts_with_bracket(path: Path) -> bool:
    """A JSON array rather than JSON lines."""
    with path.open("rb") as f:
        return f.read(4096).lstrip().startswith(b"[")


def _read_csv(path: Path) -> Source:
    """Rows keyed by the header; every value a string, as CSV has no types."""
    records, problems = [], []
    with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: spreadsheets start UTF-8 CSV with a byte-order mark
        reader = csv.DictReader(f)
        try:
            for record in reader:
                if None in record:  # DictReader files cells beyond the header under the key None
                    problems.append(
                        DataProblem(
                            str(path),
                            reader.line_num,
                            f"{len(reader.fieldnames) + len(record[None])} cells; the header has {len(reader.fieldnames)}",
                        )
                    )
                    continue
                records.append((reader.line_num, record))
        except (UnicodeDecodeError, csv.Error) as e:
            raise OxrlError(f"{path}:{reader.line_num + 1}: not readable as UTF-8 CSV ({e})") from None
    return Source(str(path), list(reader.fieldnames or []), records, problems)


def _read_json_array(path: Path) -> Source:
    try:
        items = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OxrlError(f"{path}: not a JSON array of objects nor JSON lines ({e})") from None
    if not isinstance(items, list):
        raise OxrlError(f"{path}: expected a JSON array of objects or JSON lines, got {type(items).__name__}")
    records = [(number, item) for number, item in enumerate(items, start=1) if isinstance(item, dict)]
    problems = [
        DataProblem(str(path), number, f"expected a JSON object, got {type(item).__name__}")
        for number, item in enumerate(items, start=1)
        if not isinstance(item, dict)
    ]
    return Source(str(path), _columns(record for _, record in records), records, problems)


def _columns(records: Iterable[dict]) -> list[str]:
    return list(dict.fromkeys(key for record in records for key in record))


def _load_dataset(source: str, split: str, subset: str | None):
    import datasets

    try:
        return datasets.load_dataset(source, subset, split=split)
    except (
        ConnectionError,
        FileNotFoundError,
        ValueError,
    ) as e:  # offline and not cached, no such dataset, no such split
        offline = " (offline mode is on: only cached datasets load)" if _offline() else ""
        raise OxrlError(
            f"{source}: not a data file ({', '.join(FILE_TYPES)}) or saved dataset folder, and "
            f"datasets.load_dataset failed{offline}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None


def _offline() -> bool:
    return any(
        os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
        for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )


def _pick_split(dataset, split: str, source: str):
    """The split of a DatasetDict; a Dataset is itself."""
    import datasets

    if not isinstance(dataset, datasets.DatasetDict):
        return dataset
    if split not in dataset:
        raise OxrlError(f"--split {split!r}: {source} has no such split; its splits: {', '.join(dataset)}")
    return dataset[split]


def _from_dataset(source: str, dataset) -> Source:
    return Source(source, list(dataset.column_names), enumerate(dataset, start=1), [])
