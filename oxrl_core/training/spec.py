"""What a trainer rank is told of a run: the config sections it uses, and what its algorithm needs of the models."""

from dataclasses import dataclass

from oxrl_core.config.sections import DeepSpeedSection, LoraSection, ModelSection, TrainCommon


@dataclass(frozen=True)
class TrainerSpec:
    model: ModelSection
    lora: LoraSection
    deepspeed: DeepSpeedSection
    train: TrainCommon  # batch sizes, optimizer, schedule, seed, forwards without gradients
    hang_timeout_s: float  # the process group's timeout is 4 x this
    reference_model: bool  # a frozen copy of the starting model runs beside the policy (a KL term, reference logprobs)
    critic: bool  # a value head trains beside the policy (PPO)
    scalar_head: bool  # the model trained is a reward model
    teacher: str | None  # KD: the teacher's folder or Hub id
    # bf16 needs no loss scale, yet DeepSpeed checks every gradient for overflow at each step (per parameter, then a
    # read on the host): 2-5% of a training step on one GPU (benchmarks/RESULTS.md). RL stops on a non-finite gradient
    # norm after the update, which DeepSpeed reports either way; supervised runs rely on DeepSpeed skipping such a
    # step instead, so there the check stays.
    check_grad_overflow: bool
    # a mixture of experts' policy forwards route each sampled token to the experts the engine recorded (router
    # replay); off, they only measure how often their own routers agree (training/routing.py)
    router_replay: bool = False
