"""benchmarks/calculator_tools.py's SFT demonstrations are what the calculator environment accepts: every one loads
through oxrl's SFT loader with its tools within the run's max_len, every tool call in them, parsed and run by the
environment, returns the problem's answer, and the share of calls and of wrong direct answers is as drawn."""

import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from oxrl_core.data.records import load_sft_examples
from oxrl_core.envs.calculator import Calculator
from oxrl_core.preprocess.arithmetic import every_arithmetic_problem, write_jsonl

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def calculator_tools(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import calculator_tools

    return calculator_tools


def test_demonstrations_load_and_their_tool_calls_give_the_answer(tmp_path, tiny_model_dir, calculator_tools):
    problems = every_arithmetic_problem(9)
    records = calculator_tools.demonstrations(problems, 400, 0.5, random.Random(0))
    examples, _ = load_sft_examples(
        write_jsonl(records, tmp_path / "sft.jsonl"), AutoTokenizer.from_pretrained(tiny_model_dir), 320, strict=True
    )
    assert len(examples) == len(records)
    answers = {p["prompt"]: p["answer"] for p in problems}
    calls = wrong = 0
    for record in records:
        question, *turns = record["messages"]
        answer = answers[question["content"]]
        if len(turns) == 3:  # a call, its result, the answer
            calls += 1
            step = Calculator().step(turns[0]["content"])
            assert not step.done and step.messages == [turns[1]] and turns[1]["content"] == answer
            assert turns[2]["content"] == f"<answer>{answer}</answer>"
        else:
            wrong += turns[0]["content"] != f"<answer>{answer}</answer>"
    assert 160 < calls < 240 and 60 < wrong < 140
