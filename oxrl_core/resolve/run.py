"""`resolve_run`: config file, command-line overrides, Python sections and (for the Python API) this machine's
defaults -> one `ResolvedRun`, the object the loops run. The CLI, the Python API, the demo, `oxrl onboard --verify`,
`oxrl doctor --smoke` and the benchmarks all get it from here; the algorithm's record is looked up once, here."""

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from oxrl_core.algs.base import Algorithm
from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.cluster.placement import PlacementRequest
from oxrl_core.config.load import apply_override, read_tree, validate
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.errors import OxrlError
from oxrl_core.models.families import family_of
from oxrl_core.models.hub import model_type
from oxrl_core.resolve.checks import check_config, placement_request, router_model_types, trainer_spec
from oxrl_core.training.deepspeed_setup import model_dtype
from oxrl_core.training.spec import TrainerSpec


@dataclass(frozen=True)
class ResolvedRun:
    config: SLConfig | RLConfig  # validated and checked, every default applied; nothing writes to it afterwards
    algorithm: Algorithm  # train.alg's record
    model_path: str  # model.name_or_path as a local folder
    placement: PlacementRequest  # what the run asks of the cluster
    trainer: TrainerSpec  # what the trainer ranks are told
    sampler_dtype: str  # the vLLM engines': the trainer's, unless vLLM's CPU kernels need another for the family
    notes: tuple[str, ...]  # what the run does otherwise than its config says, for its model's family: said at start
    # a mixture of experts that samples: the engines record routes, and the trainer replays them (True) or only
    # compares its own (False); None: nothing routes (a dense model) or the loop is not RL
    router_replay: bool | None


def resolve_run(
    loop: Literal["sl", "rl"],
    path: Path | None = None,
    overrides: Sequence[str] = (),
    sections: dict | None = None,
    machine_defaults: bool = False,
) -> ResolvedRun:
    """The run of a config file (`path`, or none), with `sections` (dicts, the Python API's) laid over it and the
    dotted `overrides` (the command line's) applied last; with `machine_defaults`, over what a config file would say
    for this machine (`machine_defaults`). OxrlError, one line, for any mistake."""
    tree = merged(read_tree(path), sections or {})
    for override in overrides:
        apply_override(tree, override)
    schema = RLConfig if loop == "rl" else SLConfig
    if machine_defaults:
        tree = merged(this_machines_defaults(tree, schema), tree)
    return resolved(validate(schema, tree))


def resolved(config: SLConfig | RLConfig) -> ResolvedRun:
    """The run of a validated config (a benchmark's or a test's, built in Python), checked."""
    algorithm = ALGORITHMS[config.train.alg]
    model_path = check_config(config, algorithm)
    family = family_of(model_type(model_path))
    dtype = str(model_dtype(config.model)).removeprefix("torch.")
    sampler_dtype, notes = dtype, ()
    if family and family.cpu_sampler_dtype and algorithm.generates and not torch.cuda.is_available():
        sampler_dtype = family.cpu_sampler_dtype
        if sampler_dtype != dtype:
            notes = (
                f"the vLLM engines run {sampler_dtype} (vLLM's CPU kernels for it take no other), the trainer {dtype}",
            )
    replay = config.rollout.router_replay
    if family and family.router and algorithm.loop == "rl":  # the policy-gradient loop's forwards replay
        replay = replay is not False
    elif replay:
        raise OxrlError(
            f"rollout.router_replay=true: {model_path} has no router oxrl records ({router_model_types()}) or "
            f"train.alg={config.train.alg} is no RL algorithm (replay is RL's); leave it unset"
        )
    placement = placement_request(config, algorithm)
    spec = trainer_spec(config, algorithm, router_replay=bool(replay))
    return ResolvedRun(config, algorithm, model_path, placement, spec, sampler_dtype, notes, replay)


def this_machines_defaults(tree: dict, schema: type[SLConfig] | type[RLConfig]) -> dict:
    """What a config file would say for this machine: one DeepSpeed rank per GPU (RL on 2+ GPUs leaves one to
    vLLM; on 1 GPU they share it), one rank on CPU; gradient accumulation that makes the batch add up."""
    gpus = torch.cuda.device_count()
    rl = schema is RLConfig
    train = tree.get("train", {})
    ranks = tree.get("run", {}).get("train_ranks") or (max(1, gpus - 1) if rl and gpus > 1 else max(1, gpus))
    common = schema.model_fields["train"].default
    batch = train.get("batch_size", common.batch_size)
    micro = min(train.get("micro_batch_size", common.micro_batch_size), max(1, batch // ranks))
    defaults = {"run": {"train_ranks": ranks}, "train": {"micro_batch_size": micro}}
    if "grad_accum" not in train and batch % (micro * ranks) == 0:
        defaults["train"]["grad_accum"] = batch // (micro * ranks)
    if ranks > 1:
        defaults["deepspeed"] = {"zero_stage": 3}
    return defaults


def merged(base: dict, update: dict) -> dict:
    """`update` laid over `base`, section by section (a new dict; neither is changed)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        out[key] = (
            merged(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else copy.deepcopy(value)
        )
    return out
