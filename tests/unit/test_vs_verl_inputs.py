"""benchmarks/vs_verl.py gives verl the work oxrl trains on: its parquet's prompts tokenize, as verl's agent loop
tokenizes them (`apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`), to the ids oxrl's loader
makes; its reward module, called as verl's reward manager calls a custom_reward_function, scores as oxrl's reward does.
No verl needed."""

import importlib.util
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml
from transformers import AutoTokenizer

from oxrl_core.data.records import load_prompts
from oxrl_core.resolve.run import resolve_run
from oxrl_core.rewards import resolve_reward

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def vs_verl(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import vs_verl

    return vs_verl


def test_verls_inputs_tokenize_and_score_as_oxrls(tmp_path, tiny_model_dir, vs_verl, monkeypatch):
    import rl_step

    monkeypatch.setattr(rl_step, "PROMPT_TOKENS", 40)
    prompts = rl_step.write_prompts(tiny_model_dir, tmp_path / "prompts.jsonl", 6)
    config_path = tmp_path / "rl.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "model": {"name_or_path": str(tiny_model_dir)},
                "data": {"train": [{"path": str(prompts)}]},
                "train": {"alg": "cispo", "batch_size": 24, "micro_batch_size": 4, "grad_accum": 6},
                "rollout": {"n_samples": 4, "max_prompt_len": 40},
                "reward": {"func": "math"},
                "run": {"output_dir": str(tmp_path / "runs")},
            }
        )
    )
    config = resolve_run("rl", config_path).config
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    paths = vs_verl.write_verl_inputs(config, tokenizer, tmp_path)

    rows = pd.read_parquet(paths["train"]).to_dict("records")
    examples, _ = load_prompts(prompts, tokenizer, 40, strict=True)
    assert len(rows) == len(examples) == 6
    for row, example in zip(rows, examples):
        ids = tokenizer.apply_chat_template([dict(m) for m in row["prompt"]], add_generation_prompt=True, tokenize=True)
        assert list(ids["input_ids"] if hasattr(ids, "keys") else ids) == example.prompt_ids

    spec = importlib.util.spec_from_file_location("verl_reward", paths["reward"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    oxrl_reward = resolve_reward("math", {})
    scores = []
    for row, example in zip(rows, examples):
        answer = example.record["answer"]
        for response in (
            f"<answer>{answer}</answer>",
            f"so \\boxed{{{answer}}}",
            f"<answer>{answer}1</answer>",
            "no answer",
        ):
            verl_score = module.compute_score(
                data_source=row["data_source"],
                solution_str=response,
                ground_truth=row["reward_model"]["ground_truth"],
                extra_info=dict(row["extra_info"]) | {"num_turns": 2},
            )
            assert verl_score == oxrl_reward(response, example.record), response
            scores.append(verl_score)
    assert set(scores) == {0.0, 1.0}


def test_verls_console_lines_become_per_step_phases(vs_verl):
    # verl 0.9.1's format: numpy scalars as `np.float64(...)`, exponents with a dash
    line = (
        "(TaskRunner pid=1) step:2 - actor/pg_loss:-0.01 - timing_s/gen:9.5 - timing_s/reward:2.5e-05 - "
        "timing_s/old_log_prob:1.0 - timing_s/update_actor:3.0 - timing_s/update_weights:0.25 - "
        "actor/perf/max_memory_allocated_gb:np.float64(40.5) - timing_s/step:15.0 - response_length/mean:500.0 - "
        "rollout_corr/kl:5.827940464019775"
    )
    (step,) = vs_verl.parse_verl_log(
        "starting\n" + line + "\nstep:3 - actor/lr:1e-06\n", samples=512, prompt_tokens=65536
    )
    assert step == pytest.approx(
        {
            "step_s": 15.0,
            "time_generate_s": 9.5,
            "time_reward_s": 2.5e-05,
            "time_logprobs_s": 1.0,
            "time_train_s": 3.0,
            "time_refresh_s": 0.25,
            "time_other_s": 1.249975,
            "samples": 512,
            "generated_tokens": 256000.0,
            "prompt_tokens": 65536,
            "trainer_peak_memory_gb": 40.5,
            "rollout_vs_trainer_kl": 5.827940464019775,
        }
    )


def test_the_versions_reported_for_verl_are_those_its_pythonpath_imports(tmp_path, vs_verl):
    site = tmp_path / "verl-site"
    for name, version in (("verl", "0.9.1"), ("transformers", "5.10.4")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    import transformers

    versions = vs_verl.versions_under({**os.environ, "PYTHONPATH": str(site)})
    assert versions["verl"] == "0.9.1" and versions["transformers"] == "5.10.4" != transformers.__version__
    assert vs_verl.versions_under(dict(os.environ))["transformers"] == transformers.__version__


def test_a_run_verl_cannot_match_is_refused_by_name(tmp_path, vs_verl):
    from oxrl_core.config.schema import RLConfig

    config = RLConfig.model_validate(
        {"data": {"train": [{"path": "p.jsonl"}]}, "lora": {"enabled": True}, "train": {"alg": "sgrpo"}}
    )
    with pytest.raises(SystemExit, match="train.alg .only cispo is mapped., lora.enabled"):
        vs_verl.verl_overrides(config, {"train": tmp_path / "t.parquet", "reward": tmp_path / "r.py"}, 1, 2, False)


def test_a_lag_of_1_split_runs_verls_one_step_off_trainer_with_its_gpus_apart_and_cispo_kept(tmp_path, vs_verl):
    from oxrl_core.config.schema import RLConfig

    paths = {"train": tmp_path / "t.parquet", "reward": tmp_path / "r.py"}
    rl = lambda **rollout: RLConfig.model_validate(
        {"data": {"train": [{"path": "p.jsonl"}]}, "run": {"train_ranks": 1}, "rollout": {"engines": 1, **rollout}}
    )
    synchronous = rl()
    assert vs_verl.verl_entry(synchronous) == "verl.trainer.main_ppo"
    assert "trainer.n_gpus_per_node=2" in vs_verl.verl_overrides(synchronous, paths, 2, 3, True)
    lagged = rl(placement="split", lag=1)
    assert vs_verl.verl_entry(lagged) == "verl.experimental.one_step_off_policy.main_ppo"
    overrides = vs_verl.verl_overrides(lagged, paths, 2, 3, True)
    assert {
        "trainer.n_gpus_per_node=1",
        "rollout.n_gpus_per_node=1",
        "actor_rollout_ref.hybrid_engine=False",
        "algorithm.rollout_correction.bypass_mode=False",
        "actor_rollout_ref.actor.policy_loss.loss_mode=cispo",
        "hydra.searchpath=[pkg://verl.trainer.config]",
    } <= set(overrides)
    assert len({o.split("=")[0] for o in overrides}) == len(overrides)  # each key once
    for rollout, words in (
        ({"placement": "split"}, "placement=split .mapped at rollout.lag=1 only"),
        ({"lag": 1, "placement": "colocated"}, "rollout.lag .mapped at 1 with"),
        ({"max_staleness": 2, "placement": "split"}, "fully asynchronous trainer is not mapped"),
    ):
        with pytest.raises(SystemExit, match=words):
            vs_verl.verl_overrides(rl(**rollout), paths, 2, 3, True)


def test_the_one_step_off_trainers_weight_sync_is_read_as_the_refresh(vs_verl):
    line = (
        "step:2 - timing_s/gen:4.0 - timing_s/sync_rollout_weights:0.5 - timing_s/old_log_prob:1.0 - "
        "timing_s/update_actor:3.0 - timing_s/step:9.0 - response_length/mean:100.0"
    )
    (step,) = vs_verl.parse_verl_log(line, samples=8, prompt_tokens=1024)
    assert (step["time_generate_s"], step["time_refresh_s"], step["time_other_s"]) == (4.0, 0.5, 0.5)
