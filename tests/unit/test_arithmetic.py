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


def test_shipped_preference_kto_and_text_data_are_the_generators_output():
    from oxrl_core.preprocess.arithmetic import preference_records, text_records, unpaired_records

    for name, n, seed in (("train", 256, 0), ("val", 64, 1)):
        problems = arithmetic_problems(n, seed=seed)
        for kind, records in (
            ("pref", preference_records(problems, seed)),
            ("kto", unpaired_records(problems, seed)),
            ("text", text_records(problems)),
        ):
            shipped = (REPO / "examples" / "data" / f"arithmetic_{kind}_{name}.jsonl").read_text().splitlines()
            assert [json.loads(line) for line in shipped] == records


def test_preference_sets_pair_the_right_answer_with_a_wrong_one_and_kto_has_both_labels():
    from oxrl_core.preprocess.arithmetic import preference_records, unpaired_records

    problems = arithmetic_problems(100, seed=4)
    for p, pair in zip(problems, preference_records(problems, seed=4)):
        assert pair["chosen"] == f"<answer>{p['answer']}</answer>"
        wrong = int(re.fullmatch(r"I think it is (-?\d+)\.", pair["rejected"]).group(1))
        assert wrong != int(p["answer"])
    labels = [r["label"] for r in unpaired_records(problems, seed=4)]
    assert 30 < sum(labels) < 70
