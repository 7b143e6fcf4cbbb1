"""`oxrl preprocess` through the console script: files written, the table, exit codes, one-line errors, the README's commands."""

import json
import os
import subprocess
import sys
from pathlib import Path

import doc_pages
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
OXRL = Path(sys.executable).parent / "oxrl"
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}  # COLUMNS: rich wraps to the terminal

GSM8K = [
    {
        "question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
        "answer": "48/2 = <<48/2=24>>24 in May.\n48+24 = <<48+24=72>>72\n#### 72",
    },
    {"question": "How many?", "answer": "It is 4."},
]
PREFERENCE = [
    {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"},
    {
        "chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "go away"}],
    },
]
BAD_PREFERENCE = {"prompt": "x", "chosen": "y"}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_gsm8k_writes_parquet_and_manifest_prints_counts_and_drops_and_exits_0(oxrl, tmp_path):
    source = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    result = oxrl("preprocess", source, "--format", "gsm8k", "--out", tmp_path / "out", env=OFFLINE)
    assert result.returncode == 0, result.stderr
    assert pq.read_table(tmp_path / "out" / "train.parquet").to_pylist() == [
        {"prompt": GSM8K[0]["question"], "answer": "72"}
    ]
    manifest = json.loads((tmp_path / "out" / "train.manifest.json").read_text())
    assert manifest["counts"] == {"read": 2, "written": 1, "dropped": 1}
    for shown in (
        "rows read",
        "rows written",
        "rows dropped",
        manifest["sha256"],
        "dropped row 2: no '####' in field 'answer'",
        f"wrote {tmp_path / 'out' / 'train.manifest.json'}",
    ):
        assert shown in result.stdout, shown


def test_preference_strict_refuses_a_bad_row_in_one_line_and_converts_a_clean_file(oxrl, tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [*PREFERENCE, BAD_PREFERENCE])
    result = oxrl("preprocess", bad, "--format", "preference", "--out", tmp_path / "out", "--strict", env=OFFLINE)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith(f"error: {bad}:3: missing field 'rejected'")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()

    clean = write_jsonl(tmp_path / "prefs.jsonl", PREFERENCE)
    result = oxrl(
        "preprocess",
        clean,
        "--format",
        "preference",
        "--out",
        tmp_path / "out",
        "--split",
        "val",
        "--strict",
        env=OFFLINE,
    )
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(tmp_path / "out" / "val.parquet").to_pylist()
    assert [r["chosen"] for r in rows] == [
        [{"role": "assistant", "content": "4"}],
        [{"role": "assistant", "content": "hello"}],
    ]
    assert json.loads((tmp_path / "out" / "val.manifest.json").read_text())["dropped"] == []


def test_a_bad_map_is_one_line_naming_the_columns_that_exist(oxrl, tmp_path):
    source = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    result = oxrl(
        "preprocess", source, "--format", "generic", "--map", "prompt=query", "--out", tmp_path / "out", env=OFFLINE
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip() == f"error: --map prompt=query: no such column in {source}; its columns: question, answer"
    )
    malformed = oxrl(
        "preprocess", source, "--format", "generic", "--map", "prompt", "--out", tmp_path / "out", env=OFFLINE
    )
    assert malformed.returncode == 2
    assert malformed.stderr.strip() == "error: --map 'prompt': expected NEW=OLD, e.g. --map prompt=question"


def test_a_missing_file_and_an_uncached_hub_id_offline_are_one_line_errors(oxrl, tmp_path):
    missing = oxrl("preprocess", tmp_path / "nope.jsonl", "--format", "gsm8k", "--out", tmp_path / "out", env=OFFLINE)
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: {tmp_path / 'nope.jsonl'}: no such file"
    hub = oxrl(
        "preprocess",
        "not-an-org/not-cached",
        "--subset",
        "main",
        "--format",
        "gsm8k",
        "--out",
        tmp_path / "out",
        env=OFFLINE,
    )
    assert hub.returncode == 2 and "Traceback" not in hub.stderr
    lines = hub.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: not-an-org/not-cached: not a data file")
    assert "offline mode is on: only cached datasets load" in lines[0]


def test_a_folder_of_data_files_loads_through_datasets(oxrl, tmp_path):
    folder = tmp_path / "cloned-dataset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", GSM8K)
    result = oxrl(
        "preprocess",
        folder,
        "--format",
        "gsm8k",
        "--out",
        tmp_path / "out",
        env={**OFFLINE, "HF_DATASETS_CACHE": str(tmp_path / "cache")},
    )  # datasets caches what it loads
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "train.manifest.json").read_text())
    assert manifest["counts"] == {"read": 2, "written": 1, "dropped": 1} and manifest["dropped"][0]["row"] == 2


def test_every_preprocess_command_the_pages_show_runs(tmp_path):
    """The quick start's, which build on each other, run in its integration test."""
    commands = sorted({c.text for c in doc_pages.commands("oxrl preprocess ")} - doc_pages.quickstart_lines())
    assert len(commands) >= 3
    write_jsonl(tmp_path / "gsm8k_train.jsonl", GSM8K)
    write_jsonl(tmp_path / "prefs.jsonl", PREFERENCE)
    (tmp_path / "my_data.csv").write_text("question,label\nWhat is 1+1?,2\n")
    for command in commands:  # from a folder that holds the files the pages name
        result = subprocess.run(
            [str(OXRL), *command.split()[1:]],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, **OFFLINE},
            timeout=300,
        )
        assert result.returncode == 0, (command, result.stderr)
        args = command.split()
        split = args[args.index("--split") + 1] if "--split" in args else "train"
        assert (tmp_path / args[args.index("--out") + 1] / f"{split}.parquet").is_file(), command
    assert pq.read_table(tmp_path / "data" / "mine" / "train.parquet").to_pylist() == [
        {"prompt": "What is 1+1?", "answer": "2"}
    ]
