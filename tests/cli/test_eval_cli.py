"""`oxrl eval` refuses mistakes in one line, exit code 2, before vLLM starts or anything is written."""

import re

import pytest

from oxrl_cli.eval import _ks, _reward_kwargs
from oxrl_core.errors import OxrlError
from oxrl_core.evaluation.run import EvalSettings, check_settings


@pytest.mark.parametrize(
    "extra, data_name, message",
    [
        (["--n", "8", "--k", "1,16"], "p.jsonl", "--k 16: pass@k needs 1 <= k <= --n (8)"),
        ([], "missing.jsonl", "missing.jsonl: no such data file"),
        (
            ["--reward", "env"],
            "p.jsonl",
            "--reward env: an environment's own score exists only for the episodes of an RL run",
        ),
    ],
    ids=["k-above-n", "missing-data", "environment-reward"],
)
def test_console_script_exits_2_with_one_line_and_writes_nothing(
    oxrl, tiny_model_dir, tmp_path, extra, data_name, message
):
    (tmp_path / "p.jsonl").write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    out = tmp_path / "eval"
    result = oxrl(
        "eval", "--model", tiny_model_dir, "--data", tmp_path / data_name, "--reward", "math", "--out", out, *extra
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    assert not out.exists()


@pytest.mark.parametrize(
    "settings, message",
    [
        (EvalSettings(n=8, ks=(1, 8), temperature=0.0), "--n 8 with --temperature 0: greedy decoding"),
        (EvalSettings(n=4, ks=(0,)), "--k 0: pass@k needs 1 <= k <= --n (4)"),
        (EvalSettings(temperature=-0.5), "--temperature -0.5: must be >= 0"),
        (EvalSettings(n=0, ks=(1,)), "--n 0: samples per prompt must be at least 1"),
        (EvalSettings(gpu_memory_utilization=1.5), "--gpu-memory-utilization 1.5: must be in (0, 1]"),
    ],
    ids=["greedy-with-n-8", "k-0", "negative-temperature", "n-0", "memory-share"],
)
def test_settings_that_cannot_make_an_evaluation_are_refused(settings, message):
    with pytest.raises(OxrlError, match=re.escape(message)):
        check_settings(settings)


def test_greedy_with_one_sample_is_accepted():
    check_settings(EvalSettings(n=1, ks=(1,), temperature=0.0))


def test_k_defaults_to_1_and_n_and_parses_a_comma_list():
    assert _ks(None, 8) == (1, 8) and _ks(None, 1) == (1,) and _ks("1,2,4", 4) == (1, 2, 4)
    with pytest.raises(OxrlError, match="--k '1,x': expected comma-separated whole numbers"):
        _ks("1,x", 4)


def test_reward_kwargs_must_be_a_json_object():
    assert _reward_kwargs('{"path": "rm"}') == {"path": "rm"}
    with pytest.raises(OxrlError, match=r"--reward-kwargs '\[1\]': expected a JSON object"):
        _reward_kwargs("[1]")
    with pytest.raises(OxrlError, match="--reward-kwargs '{path': not JSON"):
        _reward_kwargs("{path")
