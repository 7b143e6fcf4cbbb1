"""The run configuration: pydantic models for SL and RL runs.

Every field here is documented by its `description`; the config reference is generated from these models
(`oxrl_core.config.reference`). The sections every run shares are `sections.py`; each algorithm's own settings, the
`train.<alg>` block, are declared in its file (`oxrl_core/algs/`). Cross-field and file-system checks live in
`oxrl_core/resolve/checks.py`.
"""

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, create_model, model_serializer, model_validator

from oxrl_core.algs.registry import ALGORITHMS, DECLARED, names, taking
from oxrl_core.algs.settings import PositiveInt, Section, Settings
from oxrl_core.config.sections import (
    DataSection,
    DeepSpeedSection,
    LoraSection,
    ModelSection,
    RewardSection,
    RolloutSection,
    RunSection,
    TrainCommon,
)
from oxrl_core.errors import OxrlError


class AlgorithmTrain(TrainCommon):
    """A loop's `train` section: the shared settings, the algorithm's name, and its own settings as one block,
    `train.<alg>` (declared in its file, `oxrl_core/algs/`); unset, the block holds the algorithm's defaults. One
    config may hold several algorithms' blocks (each checked), so that `--alg` picks among them."""

    loop: ClassVar[str]

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            alg = data.get("alg", cls.model_fields["alg"].default)
            for key in data:
                if key not in cls.model_fields and key in MOVED:
                    raise OxrlError(moved_setting(f"train.{key}", MOVED[key], alg, cls.loop))
        return data

    @model_validator(mode="after")
    def _the_chosen_block_filled(self) -> "AlgorithmTrain":
        if getattr(self, block_field(self.alg)) is None:
            setattr(self, block_field(self.alg), ALGORITHMS[self.alg].settings())
        return self

    @model_serializer(mode="wrap")
    def _without_unset_blocks(self, handler) -> dict:
        unset = {
            key
            for name in names(self.loop)
            if getattr(self, block_field(name)) is None
            for key in (name, block_field(name))
        }
        return {key: value for key, value in handler(self).items() if key not in unset}

    @property
    def settings(self) -> Settings:
        """The chosen algorithm's settings, `train.<alg>`."""
        return getattr(self, block_field(self.alg))


def block_field(alg: str) -> str:
    """The Python name of algorithm `alg`'s block (its YAML key is `alg` itself, e.g. `reinforce++`)."""
    return "alg_" + alg.replace("-", "_").replace("+", "p")


def _blocks(loop: str) -> dict:
    return {
        block_field(name): (
            ALGORITHMS[name].settings | None,
            Field(None, alias=name, description=f"--alg {name}: its settings."),
        )
        for name in names(loop)
    }


class SLTrainCommon(AlgorithmTrain):
    loop = "sl"
    alg: Literal[names("sl")] = Field("sft", description="Supervised algorithm (CLI: --alg).")
    eval_every: Annotated[int, Field(ge=0)] = Field(
        0, description="Evaluate on `data.val` every N steps (0: only at the end)."
    )


class RLTrainCommon(AlgorithmTrain):
    loop = "rl"
    alg: Literal[names("rl")] = Field("cispo", description="RL algorithm (CLI: --alg).")
    batch_size: PositiveInt = Field(
        64, description="Samples (prompts x n_samples) per optimizer step, all ranks together."
    )
    grad_accum: PositiveInt = Field(8, description="Micro-batches per optimizer step on one rank.")
    max_bad_steps: PositiveInt = Field(
        3, description="Stop (with a checkpoint) after this many consecutive steps skipped for NaN/Inf."
    )
    eval_every: Annotated[int, Field(ge=0)] = Field(
        0, description="Greedy accuracy on `data.val` every N steps (0: before and after training only)."
    )


SLTrain = create_model("SLTrain", __base__=SLTrainCommon, __module__=__name__, **_blocks("sl"))
RLTrain = create_model("RLTrain", __base__=RLTrainCommon, __module__=__name__, **_blocks("rl"))
# Where each setting that was once a key of `train` (or of `rollout`) now lives: {old key: its name in the blocks}.
MOVED = {
    **{key: key for name in DECLARED for key in ALGORITHMS[name].settings.model_fields},
    "simpo_gamma": "gamma",
    "orpo_lambda": "lam",
    "kd_alpha": "alpha",
    "kd_temperature": "temperature",
    "rft_threshold": "threshold",
}


def moved_setting(old: str, key: str, alg: str, loop: str) -> str:
    """The one line for a setting given where it was before algorithms owned their settings."""
    takers = taking(key, loop)
    if alg in takers:
        return f"{old}: moved to train.{alg}.{key} (each algorithm's settings are its own block, train.<alg>)"
    return (
        f"{old}: --alg {alg} has no such setting; {key} is a setting of --alg {', '.join(takers)} (train.<alg>.{key})"
    )


class SLConfig(Section):
    """An `oxrl train sl` run."""

    model: ModelSection = ModelSection()
    lora: LoraSection = LoraSection()
    data: DataSection
    train: SLTrain = SLTrain()
    rollout: RolloutSection = Field(
        default_factory=RolloutSection, description="RFT, SPIN, Online DPO: sampling from the policy with vLLM."
    )
    reward: RewardSection = Field(
        default_factory=RewardSection, description="RFT, Online DPO: what scores the policy's samples."
    )
    deepspeed: DeepSpeedSection = DeepSpeedSection()
    run: RunSection = Field(default_factory=RunSection)


class RLConfig(Section):
    """An `oxrl train rl` run."""

    model: ModelSection = ModelSection()
    lora: LoraSection = LoraSection()
    data: DataSection
    train: RLTrain = RLTrain()
    rollout: RolloutSection = RolloutSection()
    reward: RewardSection = RewardSection()
    deepspeed: DeepSpeedSection = DeepSpeedSection()
    run: RunSection = Field(default_factory=RunSection)

    @model_validator(mode="after")
    def _pipelined_runs_correct_for_the_sampler(self) -> "RLConfig":
        """Samples k versions old: their weights p_old / q are not near 1, so a pipelined or asynchronous run corrects
        them (token-truncate) unless its algorithm's settings choose otherwise."""
        settings = self.train.settings
        if (
            (self.rollout.lag or self.rollout.max_staleness)
            and "sampler_correction" not in settings.model_fields_set
            and settings.sampler_correction == "none"
        ):
            settings.sampler_correction = "token-truncate"
        return self
