"""Reading dataset files record by record, with every problem tied to its file and line."""

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from rich.console import Console

from oxrl_core.data.media import KIND_FIELDS, bind_media, has_media, media_policy, message_media
from oxrl_core.data.sft import SFTExample, chat_template_ids, content_text, tokenize_sft
from oxrl_core.envs.base import Environment
from oxrl_core.errors import OxrlError

ROLES = ("system", "user", "assistant", "tool")
EXTENSIONS = (".jsonl", ".json", ".parquet")


@dataclass
class DataProblem:
    path: str
    line: int  # 1-based line (JSON lines) or row (parquet)
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class DataReport:
    path: str
    total: int  # records and unreadable lines; blank lines do not count
    kept: int
    problems: list[DataProblem]


def read_records(path: Path) -> tuple[list[tuple[int, dict]], list[DataProblem]]:
    """(line, record) pairs of a .jsonl/.json (JSON lines) or .parquet file, and the lines that are not records."""
    path = Path(path)
    if path.suffix not in EXTENSIONS:
        raise OxrlError(f"{path}: unsupported data file type {path.suffix!r}; allowed: {', '.join(EXTENSIONS)}")
    if not path.is_file():
        raise OxrlError(f"{path}: no such data file")
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except pa.ArrowException as e:
            raise OxrlError(f"{path}: not a readable parquet file ({str(e).splitlines()[0]})") from None
        return list(enumerate(rows, start=1)), []
    records, problems = [], []
    with path.open("rb") as f:  # bytes: json.loads decodes each line, so one bad byte spoils only its line
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(DataProblem(str(path), number, f"malformed JSON ({e.msg} at column {e.colno})"))
                continue
            except UnicodeDecodeError:
                problems.append(DataProblem(str(path), number, "not UTF-8 text"))
                continue
            if not isinstance(record, dict):
                problems.append(DataProblem(str(path), number, f"expected a JSON object, got {type(record).__name__}"))
                continue
            records.append((number, record))
    return records, problems


def sft_messages(record: dict) -> list[dict]:
    """A TRL-style SFT record as a conversation; ValueError(reason) when it is not one.

    Accepted: {"messages": [...]}, or {"prompt": str | [...], "completion": str | [...]}
    where a string prompt is one user message and a string completion one
    assistant message. Every assistant message is trained on, including any
    inside a conversational prompt.
    """
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"field 'messages' must be a non-empty list of {{role, content}}, got {messages!r:.80}")
    elif "prompt" in record or "completion" in record:
        for name in ("prompt", "completion"):
            if name not in record:
                raise ValueError(
                    f"missing field {name!r} (an SFT record needs 'messages', or 'prompt' and 'completion')"
                )
        completion = record["completion"]
        if isinstance(completion, str) and not completion.strip():
            raise ValueError("empty completion")
        messages = _as_turns(record["prompt"], "user", "prompt") + _as_turns(completion, "assistant", "completion")
    else:
        raise ValueError(
            f"no 'messages' or 'prompt'/'completion' fields (found: {', '.join(sorted(record)) or 'none'})"
        )
    check_messages(messages)
    if not any(m["role"] == "assistant" and content_text(m["content"]).strip() for m in messages):
        raise ValueError("empty response: no assistant message with content")
    return messages


def check_messages(messages: list) -> None:
    """ValueError unless every message is {role, content} with a known role, and content a string or a list of parts:
    {"type": "text", "text": string}, or {"type": "image"} or {"type": "audio"} holding its item (bound from the
    record's `images` or `audios`, data/media.py), in a user or system message."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str | list):
            raise ValueError(
                f"message {i} must be {{role: one of {', '.join(ROLES)}, content: string or list of parts}}, "
                f"got {m!r:.80}"
            )
        for part in m["content"] if isinstance(m["content"], list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                continue
            if kind not in KIND_FIELDS:
                raise ValueError(
                    f"message {i}: a content part must be {{type: text, text: string}}, {{type: image}} or "
                    f"{{type: audio}}, got {part!r:.80}"
                )
            if not isinstance(part.get(kind), np.ndarray):
                raise ValueError(
                    f"message {i} has an {kind} part but the record has no {' (or '.join(KIND_FIELDS[kind])}) field"
                )
            if m["role"] not in ("user", "system"):
                raise ValueError(f"message {i}: {kind}s go in user or system messages, not in a {m['role']} message")


def _as_turns(value, role: str, name: str) -> list:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return value
    raise ValueError(f"field {name!r} must be a string or a list of messages, got {type(value).__name__}")


def prompt_messages(record: dict) -> list[dict]:
    """An RL record's prompt as messages: `messages`, else `prompt` (a string is one user message)."""
    name = "messages" if "messages" in record else "prompt"
    return list(_as_turns(record[name], "user", name))


def load_sft_examples(path: Path, tokenizer, max_len: int, strict: bool) -> tuple[list[SFTExample], DataReport]:
    """Tokenized SFT examples of a file; bad records are skipped and reported (fatal when `strict`)."""
    if not tokenizer.chat_template:
        raise OxrlError(
            f"model.name_or_path: its tokenizer has no chat template; SFT records ({path}) are rendered with it"
        )
    return load_examples(
        path,
        lambda record: tokenize_sft(sft_messages(record), tokenizer, max_len, record_tools(record)),
        strict,
        "SFT",
        tokenizer,
    )


def record_tools(record: dict) -> list[dict] | None:
    """A record's `tools` (TRL's column): the function specs its chat template offers, as an RL environment's are."""
    tools = record.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ValueError(f"field 'tools' must be a list of function specs (objects), got {str(tools)[:60]}")
    return tools or None


@dataclass
class PromptExample:
    prompt_ids: list[int]
    record: dict  # the whole record: the reward reads its ground truth (answer, tests, ...)
    media: tuple[np.ndarray, ...] = ()  # the prompt's images or audio clips, prepared (data/media.py), in order


def load_prompts(
    path: Path, tokenizer, max_prompt_len: int, strict: bool, new_env: Callable[[], Environment] | None = None
) -> tuple[list[PromptExample], DataReport]:
    """RL prompts: `prompt` (string or messages) or `messages`, with the chat template's generation prompt. With an
    environment (`new_env` builds one), an episode's opening: the messages its `reset` gives for the record, and
    the tools it offers."""

    def convert(record: dict) -> PromptExample:
        name = "messages" if "messages" in record else "prompt"
        if name not in record:
            raise ValueError(
                "missing field 'prompt' (an RL record needs 'prompt' or 'messages', plus what its reward reads)"
            )
        messages = prompt_messages(record)
        if not messages:
            raise ValueError(f"field {name!r} is an empty list")
        check_messages(messages)
        tools = None
        if new_env is not None:
            if message_media(messages):
                raise ValueError(
                    "a record with media: episodes against an environment (rollout.env) are text-only for now"
                )
            env = new_env()
            messages, tools = env.reset(record), env.tools or None
        ids = chat_template_ids(tokenizer, messages, add_generation_prompt=True, tools=tools)
        if len(ids) > max_prompt_len:
            raise ValueError(f"prompt is {len(ids)} tokens; rollout.max_prompt_len is {max_prompt_len}")
        return PromptExample(ids, record, tuple(message_media(messages)))

    return load_examples(path, convert, strict, "prompt", tokenizer)


def load_examples(
    path: Path, convert: Callable[[dict], object], strict: bool, kind: str, tokenizer=None
) -> tuple[list, DataReport]:
    """`convert` every record of a file; a ValueError becomes a problem tied to the record's line. With the model's
    `tokenizer`, a record's media are read and prepared first (data/media.py), into their parts."""
    records, problems = read_records(path)
    total = len(records) + len(problems)
    examples = []
    for number, record in records:
        try:
            if tokenizer is not None and has_media(record):
                record = bind_media(record, Path(path).parent, media_policy(tokenizer.name_or_path))
            examples.append(convert(record))
        except ValueError as e:
            problems.append(DataProblem(str(path), number, str(e)))
    problems.sort(key=lambda p: p.line)
    check_problems(str(path), examples, problems, strict, kind)
    return examples, DataReport(str(path), total, len(examples), problems)


def check_problems(name: str, kept: list, problems: list, strict: bool, kind: str) -> None:
    """OxrlError when a bad record must stop the run: any with `strict`, or all of them."""
    if strict and problems:
        raise OxrlError(f"{problems[0]} (--strict makes bad records fatal; {len(problems)} bad in all)")
    if not kept:
        if not problems:
            raise OxrlError(f"{name}: no records; it is empty")
        raise OxrlError(f"{name}: no usable {kind} record; all {len(problems)} are bad, the first: {problems[0]}")


def report_data(reports: list[DataReport], run_dir: Path, console: Console) -> None:
    """Print a line per skipped record (the first few) and keep them all in the run folder."""
    problems = [p for r in reports for p in r.problems]
    say = partial(console.print, soft_wrap=True, highlight=False, markup=False)  # paths and records print verbatim
    for r in reports:
        say(f"data {r.path}: {r.kept} of {r.total} records used, {len(r.problems)} skipped")
    for p in problems[:10]:
        say(f"  skipped {p}")
    if len(problems) > 10:
        say(f"  ... and {len(problems) - 10} more (all in skipped_records.txt)")
    if problems:
        (run_dir / "skipped_records.txt").write_text("".join(f"{p}\n" for p in problems))
