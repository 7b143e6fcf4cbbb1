"""A run's checks before any engine starts: the fields that need each other, the files, the disk, the model, the
placement on this machine's GPUs, and the algorithm's own checks, so that a mistake is one line. They read the config
and change nothing of it (its defaults are the schema's and each algorithm's settings')."""

import os
from pathlib import Path

import torch
from pydantic import ValidationError

from oxrl_core.algs.base import Algorithm
from oxrl_core.algs.registry import ALGORITHMS, names
from oxrl_core.cluster.placement import PlacementRequest, decide, local_gpus
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.config.sections import JudgeSection
from oxrl_core.envs import resolve_env
from oxrl_core.errors import OxrlError
from oxrl_core.models.families import FAMILIES, family_of
from oxrl_core.models.hub import meta_model, model_type, resolve_model
from oxrl_core.training.deepspeed_setup import deepspeed_config, name_the_accelerator
from oxrl_core.training.spec import TrainerSpec

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


def placement_request(config: SLConfig | RLConfig, algorithm: Algorithm) -> PlacementRequest:
    """What the run asks of the cluster: its ranks, its vLLM engines (none if its algorithm samples nothing), and
    its LLM judge's placement (RL with `reward.func: judge` only)."""
    rollout = config.rollout
    judged = isinstance(config, RLConfig) and config.reward.func == "judge"
    return PlacementRequest(
        train_ranks=config.run.train_ranks,
        engines=rollout.engines if algorithm.generates else 0,
        tensor_parallel_size=rollout.tensor_parallel_size,
        mode=rollout.placement,
        judge=config.reward.judge.placement if judged else None,
    )


def trainer_spec(config: SLConfig | RLConfig, algorithm: Algorithm, router_replay: bool = False) -> TrainerSpec:
    """What the trainer ranks are told of the run: the sections they use and what its algorithm needs of the models;
    `router_replay`: the resolved `rollout.router_replay` (`resolve.run`)."""
    settings = config.train.settings
    return TrainerSpec(
        model=config.model,
        lora=config.lora,
        deepspeed=config.deepspeed,
        train=config.train,
        hang_timeout_s=config.run.hang_timeout_s,
        reference_model=algorithm.reference_model(settings),
        critic=algorithm.critic,
        scalar_head=algorithm.scalar_head,
        teacher=settings.teacher if algorithm.teacher else None,
        check_grad_overflow=algorithm.loop == "sl",
        router_replay=router_replay,
    )


def check_config(config: SLConfig | RLConfig, algorithm: Algorithm) -> str:
    """Raise OxrlError for the first impossible combination; return the resolved model path."""
    train, ds, run = config.train, config.deepspeed, config.run
    if train.micro_batch_size * train.grad_accum * run.train_ranks != train.batch_size:
        product = train.micro_batch_size * train.grad_accum * run.train_ranks
        raise OxrlError(
            f"train.batch_size={train.batch_size}: must equal train.micro_batch_size ({train.micro_batch_size}) "
            f"x train.grad_accum ({train.grad_accum}) x run.train_ranks ({run.train_ranks}) = {product}"
        )
    if train.logprobs_micro_batch_size is not None and train.logprobs_micro_batch_size % train.micro_batch_size:
        raise OxrlError(
            f"train.logprobs_micro_batch_size={train.logprobs_micro_batch_size}: must be a multiple of "
            f"train.micro_batch_size ({train.micro_batch_size}); a forward runs whole micro-batches"
        )
    if ds.offload_param and ds.zero_stage != 3:
        raise OxrlError(f"deepspeed.offload_param=true: needs deepspeed.zero_stage=3, got {ds.zero_stage}")
    if ds.offload_optimizer and ds.zero_stage == 0:
        raise OxrlError("deepspeed.offload_optimizer=true: needs deepspeed.zero_stage 1, 2 or 3, got 0")
    if ds.zero_optimization:
        check_zero_optimization(config, algorithm)
    if isinstance(config, RLConfig) and train.batch_size % config.rollout.n_samples:
        raise OxrlError(
            f"train.batch_size={train.batch_size}: must be a multiple of rollout.n_samples ({config.rollout.n_samples})"
        )
    if not os.environ.get("RAY_ADDRESS"):  # a cluster's GPUs are counted once it is joined, before any engine starts
        decide(placement_request(config, algorithm), local_gpus())
    if algorithm.check:
        algorithm.check(config)
    rollout = config.rollout
    for key in ("lag", "max_staleness"):
        if isinstance(config, SLConfig) and getattr(rollout, key):
            raise OxrlError(
                f"rollout.{key}={getattr(rollout, key)}: pipelined sampling is for `oxrl train rl`; --alg "
                f"{train.alg} samples, then trains on what it sampled; remove the setting"
            )
    if rollout.lag and rollout.max_staleness:
        raise OxrlError(
            f"rollout.lag={rollout.lag} and rollout.max_staleness={rollout.max_staleness}: choose one, a "
            f"fixed lag (reproducible) or asynchronous sampling with a staleness bound (faster)"
        )
    _check_overlong(config)

    env = config.rollout.env
    if env.name is not None and not algorithm.episodes:
        *others, last = [name for name in names("rl") if ALGORITHMS[name].episodes]
        episodic = f"{', '.join(others)} or {last}" if others else last
        raise OxrlError(f"rollout.env.name={env.name!r}: episodes train with --alg {episodic} (got {train.alg})")
    if config.reward.func == "env" and env.name is None:
        raise OxrlError("reward.func=env: the environment's own reward needs an environment (rollout.env.name)")
    if env.name is not None:
        resolve_env(env.name, env.kwargs)  # importable, and built with its kwargs
    if env.name is not None and env.max_episode_tokens < config.rollout.max_tokens:
        raise OxrlError(
            f"rollout.env.max_episode_tokens={env.max_episode_tokens}: must hold at least one full policy "
            f"message (rollout.max_tokens={config.rollout.max_tokens})"
        )

    if config.lora.enabled and not config.model.freeze_vision:
        raise OxrlError(
            "model.freeze_vision=false: needs full weights (lora.enabled=false); LoRA adapts the language model "
            "and leaves the vision encoder as it is"
        )
    if config.reward.func != "judge" and config.reward.judge != JudgeSection():
        raise OxrlError(
            f"reward.judge: set, but reward.func={config.reward.func!r}; the judge's settings apply with reward.func=judge"
        )

    for i, source in enumerate(config.data.train):
        _check_data_file(f"data.train.{i}.path", source.path)
    if config.data.val is not None:
        _check_data_file("data.val", config.data.val)
    _check_writable(run.output_dir)

    model_path = resolve_model(config.model.name_or_path)
    if config.model.router_aux_loss:
        _check_router(model_path)
    if config.lora.enabled:
        _check_lora_targets(config.lora.target_modules, model_path, config.model.trust_remote_code)
    if algorithm.teacher:
        _check_teacher(train.settings.teacher, model_path)
    return model_path


def _check_router(model_path: str) -> None:
    """The load-balancing loss is a mixture of experts' own: one of a family whose router the trainer knows."""
    kind = model_type(model_path)
    family = family_of(kind)
    if family is None or family.router is None:
        raise OxrlError(
            f"model.router_aux_loss=true: {model_path} (model_type {kind}) has no router oxrl knows; the load-balancing "
            f"loss applies to {router_model_types()}"
        )


def router_model_types() -> str:
    """The mixtures of experts whose routers oxrl knows, in words."""
    return "the mixtures of experts of model_type " + ", ".join(
        sorted(t for f in FAMILIES if f.router for t in f.model_types)
    )


def _check_teacher(teacher: str | None, student_path: str) -> None:
    """KD compares the two models' distributions token by token: they must share one tokenizer."""
    if teacher is None:
        raise OxrlError(
            "train.kd.teacher: KD needs a teacher model (a folder, a Hub id or oxrl-tiny), e.g. "
            "train.kd.teacher=Qwen/Qwen2.5-7B-Instruct"
        )
    from transformers import AutoTokenizer

    teacher_path = resolve_model(teacher, key="train.kd.teacher")
    student_vocab = AutoTokenizer.from_pretrained(student_path).get_vocab()
    teacher_vocab = AutoTokenizer.from_pretrained(teacher_path).get_vocab()
    if teacher_vocab != student_vocab:
        differ = sorted(set(teacher_vocab.items()) ^ set(student_vocab.items()), key=lambda kv: kv[1])[:3]
        raise OxrlError(
            f"train.kd.teacher={teacher!r}: its tokenizer differs from the student's ({len(teacher_vocab)} vs {len(student_vocab)} "
            f"tokens; e.g. {', '.join(f'{t!r}={i}' for t, i in differ)}); KD needs both models to share one tokenizer"
        )


def _check_overlong(config: SLConfig | RLConfig) -> None:
    buffer = config.reward.overlong_buffer
    if buffer and isinstance(config, SLConfig):
        raise OxrlError(
            f"reward.overlong_buffer={buffer}: the overlong penalty shapes RL rewards; --alg "
            f"{config.train.alg} does not use it"
        )
    env = config.rollout.env
    limit, where = (
        (env.max_episode_tokens, "rollout.env.max_episode_tokens")
        if env.name is not None
        else (config.rollout.max_tokens, "rollout.max_tokens")
    )
    if buffer > limit:
        raise OxrlError(
            f"reward.overlong_buffer={buffer}: must be at most {where} ({limit}), the length it counts back from"
        )


def _check_data_file(key: str, path: Path) -> None:
    if path.suffix not in DATA_SUFFIXES:
        raise OxrlError(
            f"{key}={str(path)!r}: unsupported file type {path.suffix!r}; allowed: {', '.join(DATA_SUFFIXES)}"
        )
    if not path.is_file():
        raise OxrlError(f"{key}={str(path)!r}: no such file")


def _check_writable(path: Path) -> None:
    existing = path
    while not existing.exists():  # the nearest existing ancestor is where the folder would be created
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OxrlError(f"run.output_dir={str(path)!r}: not writable ({existing} is not a writable folder)")


def _check_lora_targets(targets: list[str], model_path: str, trust_remote_code: bool) -> None:
    if targets == ["all-linear"]:
        return
    modules = dict(meta_model(model_path, trust_remote_code).named_modules())
    for target in targets:
        # peft's rule: a target matches a module whose full name is it or ends with "." + it
        if not any(name == target or name.endswith("." + target) for name in modules):
            linear = sorted(
                {n.rsplit(".", 1)[-1] for n, m in modules.items() if isinstance(m, torch.nn.Linear)} - {"lm_head"}
            )
            raise OxrlError(
                f"lora.target_modules: {target!r} matches no module of {model_path}; its linear layers are: "
                f"{', '.join(linear)} (or use all-linear)"
            )


def check_zero_optimization(config: SLConfig | RLConfig, algorithm: Algorithm) -> None:
    """`deepspeed.zero_optimization` merged over oxrl's settings must pass DeepSpeed's schema (DeepSpeedZeroConfig
    forbids unknown keys and checks each value), and leave the stage and offloading to oxrl's own keys."""
    owned = {
        "stage": "deepspeed.zero_stage",
        "offload_optimizer": "deepspeed.offload_optimizer",
        "offload_param": "deepspeed.offload_param",
    }
    for key in config.deepspeed.zero_optimization:
        if key in owned:
            raise OxrlError(f"deepspeed.zero_optimization.{key}: set {owned[key]} instead")
    name_the_accelerator()
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # here: DeepSpeed takes seconds to import

    try:
        DeepSpeedZeroConfig(**deepspeed_config(trainer_spec(config, algorithm))["zero_optimization"])
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}" for err in e.errors())
        raise OxrlError(
            f"deepspeed.zero_optimization: {problems} (the keys DeepSpeed takes: "
            f"https://www.deepspeed.ai/docs/config-json/#zero-optimizations-for-fp16-training)"
        ) from None
