"""An algorithm's settings: the `train.<alg>` block of a run's config, declared in the algorithm's own file.

Each algorithm file declares one class of `Settings` (its fields' descriptions are the config reference's text) by
composing the groups below, the settings several algorithms take, each written once, and adding its own. A class's
fields read in the reverse order of its bases (pydantic's), so the bases are listed last group first. A setting
its definition fixes is not a field: it is a property with the fixed value, named in `fixed` with why, so that a
config that sets it is refused with that reason.
"""

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AdvantageScaling = Literal["group", "batch", "none"]
SamplerCorrection = Literal["none", "token-truncate", "token-mask", "sequence-truncate", "sequence-mask"]


class Section(BaseModel):
    # Unknown keys are mistakes (a typo must never be silently ignored); types are not coerced
    # from strings, so `lr: "1e-5"` in YAML is an error rather than a surprise.
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


class Settings(Section):
    fixed: ClassVar[dict[str, str]] = {}  # setting -> why the algorithm's definition fixes it


class Clip(Settings):
    clip_low: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.2, description="Lower clip of the importance ratio: 1 - clip_low."
    )
    clip_high: Annotated[float, Field(ge=0)] = Field(
        0.28, description="Upper clip of the importance ratio: 1 + clip_high."
    )


class KLPenalty(Settings):
    kl_coeff: Annotated[float, Field(ge=0)] = Field(
        0.0, description="Weight of the KL term to a frozen reference model; 0 loads none."
    )


class Aggregation(Settings):
    loss_agg: LossAgg = Field(
        "token-mean",
        description="How per-token losses become one number: over every response "
        "token of the batch, per sample then over samples (GRPO's), or "
        "each sample's sum over `rollout.max_tokens` (Dr. GRPO's).",
    )


class Discount(Settings):
    gamma: Annotated[float, Field(ge=0, le=1)] = Field(1.0, description="Discount per token of the return.")


class Whitening(Settings):
    adv_std_norm: AdvantageScaling = Field(
        "group",
        description="Anything but `none` whitens the per-token advantages over every response token of the batch.",
    )


class GroupScaling(Settings):
    adv_std_norm: AdvantageScaling = Field(
        "group", description="Divide group-centred rewards by the group's std, the batch's, or nothing (Dr. GRPO)."
    )


class Correction(Settings):
    sampler_correction: SamplerCorrection = Field(
        "none",
        description="Weight each token's loss by p_trainer / p_vLLM of its token (token-*) or of its sample "
        "(sequence-*), truncated at `correction_cap` (*-truncate, TIS) or left out outside [correction_floor, "
        "correction_cap] (*-mask, MIS); every step logs the gap either way. Pipelined and asynchronous runs default "
        "to token-truncate.",
    )
    correction_cap: Annotated[float, Field(ge=1)] = Field(
        2.0, description="Largest importance weight kept (see `sampler_correction`)."
    )
    correction_floor: Annotated[float, Field(ge=0, le=1)] = Field(
        0.0, description="Smallest importance weight kept: raised to it (*-truncate) or masked below it (*-mask)."
    )


class PolicyGradient(Correction):
    """What every RL algorithm takes: the sampler-trainer correction."""


class PreferenceBeta(Settings):
    beta: PositiveFloat = Field(
        0.1, description="Inverse temperature of the implicit reward (larger: stay closer to the reference)."
    )


class ReferenceChoice(Settings):
    reference: Literal["precomputed", "model"] = Field(
        "precomputed",
        description="Reference logprobs computed once by the starting model before training (no second "
        "model in memory), or by a frozen reference model at every step.",
    )


class Iterations(Settings):
    iterations: PositiveInt = Field(
        1, description="Generate-then-train rounds; `train.steps` is split evenly over them."
    )
