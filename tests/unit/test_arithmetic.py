"""The synthetic arithmetic task: seeded, correct, and the source of the shipped example data."""

import json
import re
from pathlib import Path

from oxrl_core.preprocess.arithmetic import arithmetic_problems, sft_records, write_jsonl

REPO = Path(__file__).resolve().parents[2]


def test_same_seed_same_problems_other_seed_other_problems():
    assert arithmetic_problems(50, seed=7) == arithmetic_problems(50, seed=7)
    assert arithmetic_problems(50, seed=7) != arithmetic_problems(50, seed=8)


def test_answers_are_correct_and_operands_in_range():
    for p in arithmetic_problems(300, seed=3, max_operand=20):
        a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", p["prompt"]).groups()
        assert int(a) <= 20 and int(b) <= 20
        assert int(p["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))


def test_sft_records_written_as_jsonl(tmp_path):
    records = sft_records([{"prompt": "What is 2 - 5?", "answer": "-3"}])
    assert records == [{"prompt": "What is 2 - 5?", "completion": "<answer>-3</answer>"}]
    path = write_jsonl(records, tmp_path / "new" / "d.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == records


def test_shipped_example_data_is_the_generators_output():
    for name, n, seed in (("train", 512, 0), ("val", 64, 1)):
        shipped = (REPO / "examples" / "data" / f"arithmetic_sft_{name}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in shipped] == sft_records(arithmetic_problems(n, seed=seed))
