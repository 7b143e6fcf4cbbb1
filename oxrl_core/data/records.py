"""Reading dataset files record by record, with every problem tied to its file and line."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from oxrl_core.data.sft import SFTExample, sft_messages, tokenize_sft
from oxrl_core.errors import OxrlError


@dataclass
class DataProblem:
    path: str
    line: int  # 1-based line (JSONL) or row (parquet)
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class DataReport:
    path: str
    total: int
    kept: int
    problems: list[DataProblem] = field(default_factory=list)


def read_records(path: Path) -> tuple[list[tuple[int, dict]], list[DataProblem]]:
    """(line, record) pairs of a .jsonl/.json (JSON lines) or .parquet file, and the lines that are not records."""
    path = Path(path)
    if not path.is_file():
        raise OxrlError(f"{path}: no such file")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(row, record) for row, record in enumerate(pq.read_table(path).to_pylist(), start=1)], []
    if path.suffix not in (".jsonl", ".json"):
        raise OxrlError(f"{path}: unsupported file type {path.suffix!r}; allowed: .jsonl, .json, .parquet")
    records, problems = [], []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(DataProblem(str(path), number, f"malformed JSON ({e.msg} at column {e.colno})"))
                continue
            if not isinstance(record, dict):
                problems.append(DataProblem(str(path), number, f"expected a JSON object, got {type(record).__name__}"))
                continue
            records.append((number, record))
    return records, problems


def load_sft_examples(path: Path, tokenizer, max_len: int, strict: bool) -> tuple[list[SFTExample], DataReport]:
    """Tokenized SFT examples of a file; bad records are skipped and reported (fatal when `strict`)."""
    return load_examples(path, lambda record: tokenize_sft(sft_messages(record), tokenizer, max_len), strict, "SFT")


@dataclass
class PromptExample:
    prompt_ids: list[int]
    record: dict  # the whole record: the reward reads its ground truth (answer, tests, ...)


def load_prompts(path: Path, tokenizer, max_prompt_len: int, strict: bool) -> tuple[list[PromptExample], DataReport]:
    """RL prompts: `prompt` (string or messages) or `messages`, with the chat template's generation prompt."""

    def convert(record: dict) -> PromptExample:
        messages = record.get("messages", record.get("prompt"))
        if messages is None:
            raise ValueError("missing field 'prompt' (an RL record needs 'prompt' or 'messages', plus what its reward reads)")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_prompt_len:
            raise ValueError(f"prompt is {len(ids)} tokens; rollout.max_prompt_len is {max_prompt_len}")
        return PromptExample(ids, record)

    return load_examples(path, convert, strict, "prompt")


def load_examples(path: Path, convert, strict: bool, kind: str) -> tuple[list, DataReport]:
    """`convert` every record of a file; a ValueError becomes a problem tied to the record's line."""
    records, problems = read_records(path)
    total = len(records) + len(problems)
    examples = []
    for number, record in records:
        try:
            examples.append(convert(record))
        except ValueError as e:
            problems.append(DataProblem(str(path), number, str(e)))
    problems.sort(key=lambda p: p.line)
    if strict and problems:
        raise OxrlError(f"{problems[0]} (--strict makes bad records fatal; {len(problems)} bad in all)")
    if not examples:
        raise OxrlError(f"{path}: no usable {kind} record ({len(problems)} bad; first: {problems[0] if problems else 'file is empty'})")
    return examples, DataReport(str(path), total, len(examples), problems)
