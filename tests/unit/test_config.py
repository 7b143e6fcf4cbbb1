"""Config loading: bad configs are rejected at load with the key, the value and what is allowed."""

import pytest
import yaml

from oxrl_core.config.load import dump_config, load_config
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.errors import OxrlError
from oxrl_core.models.tiny import resolve_tiny_model
from oxrl_core.resolve.run import resolve_run, resolved


@pytest.fixture
def good(tmp_path, tiny_model_dir):
    """A valid SL config tree with a real data file, model and output folder."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "completion": "<answer>2</answer>"}\n')
    return {
        "model": {"name_or_path": str(tiny_model_dir)},
        "data": {"train": [{"path": str(data)}]},
        "train": {"batch_size": 4, "micro_batch_size": 2, "grad_accum": 2},
        "run": {"output_dir": str(tmp_path / "out")},
    }


def load(tmp_path, tree, overrides=()):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    return resolve_run("sl", path, overrides)


def rejected(tmp_path, tree, overrides=()) -> str:
    with pytest.raises(OxrlError) as e:
        load(tmp_path, tree, overrides)
    return str(e.value)


def test_valid_config_loads_and_resolves_the_model(tmp_path, good, tiny_model_dir):
    run = load(tmp_path, good)
    assert run.config.train.batch_size == 4 and run.model_path == str(tiny_model_dir)


@pytest.mark.parametrize(
    "override, expected",
    [
        # unknown keys, at the top and inside a section
        ("trian.lr=1e-5", ["unknown key 'trian'", "model", "train", "run"]),
        ("train.lrr=1e-5", ["unknown key 'train.lrr'", "lr", "warmup_steps"]),
        # wrong types
        ("train.lr=fast", ["train.lr='fast'", "valid number"]),
        ("train.steps=1.5", ["train.steps=1.5", "valid integer"]),
        ("lora.enabled=maybe", ["lora.enabled='maybe'", "valid boolean"]),
        # out of range / not one of the allowed values
        ("deepspeed.zero_stage=4", ["deepspeed.zero_stage=4", "0, 1, 2 or 3"]),
        ("train.alg=ppo", ["train.alg='ppo'", "'sft'", "'dpo'"]),
        ("train.lr=-1", ["train.lr=-1", "greater than 0"]),
        ("model.dtype=fp8", ["model.dtype='fp8'", "'bfloat16'"]),
        ("run.name=a/b", ["run.name='a/b'", "pattern"]),
    ],
)
def test_schema_errors_name_the_key_value_and_allowed(tmp_path, good, override, expected):
    message = rejected(tmp_path, good, [override])
    for fragment in expected:
        assert fragment in message, (fragment, message)


def test_batch_size_must_match_micro_batch_grad_accum_and_ranks(tmp_path, good):
    message = rejected(tmp_path, good, ["run.train_ranks=2"])
    assert "train.batch_size=4" in message and "= 8" in message
    assert (
        "train.micro_batch_size (2)" in message
        and "train.grad_accum (2)" in message
        and "run.train_ranks (2)" in message
    )


@pytest.mark.parametrize("size", [1, 3])
def test_logprobs_micro_batch_not_a_multiple_of_the_training_micro_batch_is_rejected(tmp_path, good, size):
    message = rejected(tmp_path, good, [f"train.logprobs_micro_batch_size={size}"])
    assert f"train.logprobs_micro_batch_size={size}" in message and "multiple of train.micro_batch_size (2)" in message
    assert load(tmp_path, good, ["train.logprobs_micro_batch_size=6"]).config.train.logprobs_micro_batch_size == 6


def test_lora_target_absent_from_model_is_rejected_with_the_real_names(tmp_path, good):
    message = rejected(tmp_path, good, ["lora.enabled=true", "lora.target_modules=[q_proj, qkv]"])
    assert "lora.target_modules" in message and "'qkv'" in message
    assert "q_proj" in message and "down_proj" in message


def test_the_load_balancing_loss_on_a_model_without_experts_is_rejected_naming_those_with_them(
    tmp_path, good, tiny_model_dir
):
    message = rejected(tmp_path, good, ["model.router_aux_loss=true"])
    assert message == (
        f"model.router_aux_loss=true: {tiny_model_dir} (model_type qwen2) has no router oxrl knows; the "
        "load-balancing loss applies to the mixtures of experts of model_type qwen3_5_moe, qwen3_5_moe_text, qwen3_moe"
    )
    moe = resolve_tiny_model("oxrl-tiny-qwen3-moe")
    assert load(
        tmp_path, good, ["model.router_aux_loss=true", f"model.name_or_path={moe}"]
    ).config.model.router_aux_loss


def test_router_replay_is_on_for_a_mixture_of_experts_that_samples_and_refused_where_nothing_routes(
    tmp_path, good, tiny_model_dir
):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(good | {"data": {"train": [{"path": str(prompts)}]}}))
    moe = f"model.name_or_path={resolve_tiny_model('oxrl-tiny-qwen3-moe')}"

    def rl(*overrides: str):
        return resolve_run("rl", tmp_path / "rl.yaml", ["train.alg=grpo", "rollout.n_samples=2", *overrides])

    replayed, compared, dense = rl(moe), rl(moe, "rollout.router_replay=false"), rl()
    assert (replayed.router_replay, replayed.trainer.router_replay) == (True, True)
    assert (compared.router_replay, compared.trainer.router_replay) == (False, False)  # recorded, compared only
    assert (dense.router_replay, dense.trainer.router_replay) == (None, False)
    assert load(tmp_path, good, [moe]).router_replay is None  # SFT samples nothing
    sampled = load(tmp_path, good, [moe, "train.alg=online-dpo"])  # samples, and trains on pairs: no replay
    assert (sampled.router_replay, sampled.trainer.router_replay) == (None, False)
    with pytest.raises(OxrlError) as e:
        rl("rollout.router_replay=true")
    assert str(e.value) == (
        f"rollout.router_replay=true: {tiny_model_dir} has no router oxrl records (the mixtures of experts of "
        "model_type qwen3_5_moe, qwen3_5_moe_text, qwen3_moe) or train.alg=grpo is no RL algorithm (replay is RL's); "
        "leave it unset"
    )


def test_missing_data_file_is_rejected(tmp_path, good):
    message = rejected(tmp_path, good, [f"data.train.0.path={tmp_path / 'nope.jsonl'}"])
    assert "data.train.0.path=" in message and "no such file" in message


def test_unsupported_data_file_type_lists_allowed(tmp_path, good):
    (tmp_path / "train.csv").write_text("a,b\n")
    message = rejected(tmp_path, good, [f"data.train.0.path={tmp_path / 'train.csv'}"])
    assert "'.csv'" in message and ".jsonl" in message and ".parquet" in message


def test_output_dir_not_writable_is_rejected(tmp_path, good):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    message = rejected(tmp_path, good, [f"run.output_dir={blocker / 'runs'}"])
    assert "run.output_dir=" in message and "not writable" in message


def test_missing_model_folder_is_one_clear_error(tmp_path, good):
    message = rejected(tmp_path, good, ["model.name_or_path=/no/such/model"])
    assert message.startswith("model.name_or_path='/no/such/model': no such folder")
    assert "\n" not in message


def test_offload_param_needs_zero3(tmp_path, good):
    message = rejected(tmp_path, good, ["deepspeed.offload_param=true", "deepspeed.zero_stage=2"])
    assert "deepspeed.offload_param" in message and "zero_stage=3" in message


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "deepspeed.zero_optimization.stage3_prefetch_bucket_sze=5e8",
            "stage3_prefetch_bucket_sze: Extra inputs are not permitted",
        ),
        (
            "deepspeed.zero_optimization.stage3_prefetch_bucket_size=-1",
            "stage3_prefetch_bucket_size: Input should be greater than or equal to 0",
        ),
        ("deepspeed.zero_optimization.stage=2", "deepspeed.zero_optimization.stage: set deepspeed.zero_stage instead"),
    ],
)
def test_deepspeeds_zero_settings_are_checked_against_its_own_schema_at_load(tmp_path, good, override, expected):
    assert expected in rejected(tmp_path, good, ["deepspeed.zero_stage=3", override])


def test_deepspeeds_zero_settings_reach_the_engines_config_over_oxrls(tmp_path, good):
    from oxrl_core.training.deepspeed_setup import deepspeed_config

    run = load(
        tmp_path,
        good,
        [
            "deepspeed.zero_stage=3",
            "deepspeed.offload_param=true",
            "deepspeed.zero_optimization.stage3_prefetch_bucket_size=5e8",
        ],
    )
    assert deepspeed_config(run.trainer)["zero_optimization"] == {
        "stage": 3,
        "offload_param": {"device": "cpu"},
        "stage3_prefetch_bucket_size": 5e8,
    }


def test_missing_required_section_is_named(tmp_path, good):
    del good["data"]
    assert "data: required key is missing" in rejected(tmp_path, good)


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lr: [1\n  steps: 2\n")
    with pytest.raises(OxrlError, match=r"bad.yaml:\d+: not valid YAML"):
        load_config(SLConfig, path, [])


def test_a_key_given_twice_is_refused_with_its_name_and_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("model:\n  name_or_path: a\ntrain:\n  lr: 1e-5\n  steps: 2\n  lr: 3e-5\n")
    with pytest.raises(OxrlError, match=r"twice.yaml:6: not valid YAML \(key 'lr' given twice \(first on line 4\)\)"):
        load_config(SLConfig, path, [])
    path.write_text("model:\n  name_or_path: a\nmodel:\n  name_or_path: b\n")
    with pytest.raises(OxrlError, match=r"twice.yaml:3: .*key 'model' given twice \(first on line 1\)"):
        load_config(SLConfig, path, [])


def test_a_merge_key_is_overridden_by_the_mappings_own_key_not_refused(tmp_path, good):
    from oxrl_core.config.load import parse_yaml

    assert parse_yaml("base: &b {lr: 1.0e-5, steps: 2}\ntrain:\n  <<: *b\n  lr: 3.0e-5\n", "x.yaml")["train"] == {
        "lr": 3e-5,
        "steps": 2,
    }


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["train.alg=kd"], ["train.kd.teacher", "KD needs a teacher model"]),
        (
            ["train.alg=rft", "train.steps=5", "train.rft.iterations=2"],
            ["train.steps=5", "multiple of train.rft.iterations (2)"],
        ),
        (["train.alg=online-dpo", "rollout.n_samples=1"], ["rollout.n_samples=1", "at least 2 samples"]),
        (["train.alg=spin", "data.val=VAL"], ["data.val=", "SPIN has no held-out measure"]),
    ],
)
def test_algorithm_specific_mistakes_are_caught_at_load(tmp_path, good, overrides, expected):
    overrides = [o.replace("VAL", good["data"]["train"][0]["path"]) for o in overrides]
    message = rejected(tmp_path, good, overrides)
    assert all(part in message for part in expected), message


def test_dotted_overrides_change_the_resolved_config(tmp_path, good):
    config = load(
        tmp_path, good, ["train.lr=2e-5", "train.steps=7", "lora.target_modules=[q_proj]", "data.train.0.ratio=0.5"]
    ).config
    assert config.train.lr == 2e-5 and isinstance(config.train.lr, float)
    assert config.train.steps == 7
    assert config.lora.target_modules == ["q_proj"]
    assert config.data.train[0].ratio == 0.5


def test_scientific_notation_in_yaml_is_a_float(tmp_path, good):
    good["train"]["lr"] = "PLACEHOLDER"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(good).replace("PLACEHOLDER", "3e-4"))
    assert load_config(SLConfig, path, []).train.lr == 3e-4


def test_malformed_override_is_rejected():
    with pytest.raises(OxrlError, match="expected KEY=VALUE"):
        load_config(SLConfig, None, ["train.lr"])


def test_dumped_config_round_trips(tmp_path, good):
    config = load(tmp_path, good, ["train.lr=2e-5", "lora.enabled=true"]).config
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_config(config))
    assert load_config(SLConfig, path, []) == config


def test_rl_config_validates_group_size(tmp_path, good):
    good["train"] = {"batch_size": 6, "micro_batch_size": 6, "grad_accum": 1}
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(good))
    config = load_config(RLConfig, path, ["rollout.n_samples=4"])
    with pytest.raises(OxrlError, match=r"train.batch_size=6: must be a multiple of rollout.n_samples \(4\)"):
        resolved(config)


def test_cispo_with_a_kl_coefficient_is_refused_naming_the_algorithms_that_take_one(tmp_path, good):
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(good))
    with pytest.raises(
        OxrlError, match=r"unknown key 'train.cispo.kl_coeff' \(a setting of --alg dr-grpo, grpo, ppo, "
    ):
        load_config(RLConfig, path, ["train.alg=cispo", "train.cispo.kl_coeff=0.1", "rollout.n_samples=4"])
    ppo = load_config(RLConfig, path, ["train.alg=ppo", "train.ppo.kl_coeff=0.1", "rollout.n_samples=4"])
    resolved(ppo)
    assert ppo.train.settings.kl_coeff == 0.1


@pytest.mark.parametrize(
    "old, alg, says",
    [
        ("train.kl_coeff=0.1", "sgrpo", "train.kl_coeff: moved to train.sgrpo.kl_coeff"),
        (
            "train.kl_coeff=0.1",
            "cispo",
            "train.kl_coeff: --alg cispo has no such setting; kl_coeff is a setting of --alg",
        ),
        ("train.simpo_gamma=1.0", "simpo", "train.simpo_gamma: moved to train.simpo.gamma"),
        ("train.teacher=x", "kd", "train.teacher: moved to train.kd.teacher"),
        (
            "rollout.max_sampling_rounds=8",
            "dapo",
            "rollout.max_sampling_rounds: moved to train.dapo.max_sampling_rounds",
        ),
    ],
)
def test_a_setting_at_its_old_flat_key_is_one_line_naming_its_new_key(tmp_path, good, old, alg, says):
    from oxrl_core.algs.registry import SL_ALGS

    schema = SLConfig if alg in SL_ALGS else RLConfig
    with pytest.raises(OxrlError) as refused:
        load_config(
            schema, None, [f"train.alg={alg}", f"data.train=[{{path: {good['data']['train'][0]['path']}}}]", old]
        )
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # the algorithms that train on episodes, named from their records: cispo, ..., sgrpo
        (
            ["train.alg=ppo", "rollout.env.name=calculator"],
            r"rollout.env.name='calculator': episodes train with --alg cispo, .*sgrpo \(got ppo\)",
        ),
        (
            ["reward.func=env"],
            r"reward.func=env: the environment's own reward needs an environment \(rollout.env.name\)",
        ),
        (
            ["rollout.env.name=calculator", "rollout.max_tokens=64", "rollout.env.max_episode_tokens=32"],
            r"rollout.env.max_episode_tokens=32: must hold at least one full policy message \(rollout.max_tokens=64\)",
        ),
        (["rollout.env.name=calculator", "rollout.env.max_turns=17"], r"rollout.env.max_turns"),
        (
            ["rollout.env.name=chess"],
            r"rollout.env.name='chess': not a shipped environment \(calculator, guess-number\)",
        ),
    ],
)
def test_multi_turn_mistakes_are_refused_at_load(tmp_path, good, overrides, expected):
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(good))
    with pytest.raises(OxrlError, match=expected):
        resolved(load_config(RLConfig, path, ["rollout.n_samples=4", *overrides]))
    resolved(load_config(RLConfig, path, ["rollout.n_samples=4", "rollout.env.name=calculator", "reward.func=env"]))


def test_episodes_are_refused_for_the_sl_algorithms_that_sample(tmp_path, good):
    message = rejected(tmp_path, good, ["train.alg=rft", "rollout.env.name=calculator"])
    assert "episodes train with --alg cispo, " in message and message.endswith("(got rft)")


def test_internal_failure_leaves_a_crash_report_but_a_user_mistake_does_not(tmp_path):
    from oxrl_core.loops.crash import crash_report

    with pytest.raises(ZeroDivisionError), crash_report(tmp_path / "run", "train: {lr: 0.1}\n"):
        _ = 1 / 0
    report = (tmp_path / "run" / "crash.txt").read_text()
    assert "torch " in report and "train: {lr: 0.1}" in report and "ZeroDivisionError" in report
    with pytest.raises(OxrlError), crash_report(tmp_path / "other", ""):
        raise OxrlError("bad value")
    assert not (tmp_path / "other").exists()
