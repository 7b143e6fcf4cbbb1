"""What an algorithm file declares: its loss over one micro-batch, and one record of what the loops need to know.

A loss adapter (`Algorithm.loss`) reads the model's outputs (`logprobs`, and for PPO `values` and `entropy`, all
[B, T-1]; KD's `logits` and `teacher_logits` [B, T-1, V]; a reward model's `scores` [B]) and the micro-batch, and
calls the algorithm's pure loss function with its typed arguments (`Algorithm.args`: hyper-parameters from its
settings, the config's `train.<alg>` block (`settings.py`), and the global batch's normalisers). Pair algorithms
see one micro-batch of N pairs as 2N rows: the chosen sides first, then the rejected sides in the same order.
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from oxrl_core.algs.settings import Settings
from oxrl_core.errors import OxrlError

Batch = dict[str, torch.Tensor]
LossResult = tuple[torch.Tensor, dict[str, torch.Tensor]]  # the micro-batch's share of the loss, metric sums
BatchLoss = Callable[[Batch, Batch, Any], LossResult]  # (model outputs, micro-batch, args): `Algorithm.loss`
# Every rank's metric sums of a batch, as its loss returned them (an RL loop adds `tokens`, the batch's response
# tokens) -> the metrics reported
Metrics = Callable[[dict[str, float]], dict[str, float]]


@dataclass(frozen=True)
class LossArgs:
    """An algorithm's loss arguments: its hyper-parameters and the global batch's normalisers."""

    @property
    def entropy_grad(self) -> bool:
        """Whether the loss takes the policy entropy's gradient (PPO's bonus); otherwise entropy is only a metric."""
        return False


@dataclass(frozen=True)
class PairArgs(LossArgs):
    num_pairs: float  # pairs in the global batch whose responses both have tokens


@dataclass(frozen=True)
class GlobalBatch:
    """One optimizer step's micro-batches, every rank's: what the losses normalise by, so that the summed
    micro-batch losses are the loss of the whole batch at once."""

    micro_batches: list[Batch]
    max_tokens: float = 0.0  # the constant of Dr. GRPO's token-sum normalisation (rollout.max_tokens)
    kl_baseline: float = 0.0  # KTO's reference point z (`Algorithm.kl_baseline`), of the step's batch

    def tokens(self) -> float:
        """Response tokens."""
        return sum(float(b["response_mask"].sum()) for b in self.micro_batches)

    def sequences(self) -> float:
        """Rows, padding filler included (RL: the step's samples)."""
        return float(sum(len(b["response_mask"]) for b in self.micro_batches))

    def sequences_with_tokens(self) -> float:
        """Rows that have response tokens (not filler)."""
        return sum(float((b["response_mask"].sum(-1) > 0).sum()) for b in self.micro_batches)

    def pair_halves(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per micro-batch of pairs: the chosen and rejected sides' response lengths, [N] each."""
        return [b["response_mask"].sum(-1).chunk(2) for b in self.micro_batches]

    def pairs(self) -> float:
        """Pairs that count: both responses have tokens."""
        return sum(float(((c > 0) & (r > 0)).sum()) for c, r in self.pair_halves())


# Where an algorithm's reference logprobs come from. none: it has none; configurable: computed once by the
# starting model, or by a frozen reference model at every step (its `reference` setting); model: always the frozen
# model; iteration: the policy at each iteration's start, computed then (SPIN); kl: a frozen model when its `kl_coeff`
# setting is above 0.
Reference = Literal["none", "configurable", "model", "iteration", "kl"]
# RL: how the advantages are estimated (`advantages.ESTIMATORS`): group-relative (GRPO's), leave-one-out (RLOO), the
# batch-normalised discounted return with or without a group baseline (REINFORCE++), or GAE from a critic (PPO).
Estimator = Literal["group", "leave-one-out", "reinforce++", "reinforce++-baseline", "gae"]


@dataclass(frozen=True)
class Algorithm:
    name: str  # what users type: --alg NAME
    loop: Literal["sl", "rl"]
    data: Literal["conversations", "pairs", "unpaired", "text", "prompts", "demonstrations"]  # what data.train holds
    loss: BatchLoss  # (model outputs, micro-batch, args); the trainer ranks receive it with each step
    args: Callable[[Any, GlobalBatch], LossArgs]  # (its settings, the step's global batch)
    metrics: Metrics  # what its loss's sums report
    settings: type[Settings] = Settings  # its `train.<alg>` block
    reference: Reference = "none"
    critic: bool = False  # a value head trains beside the policy (PPO)
    teacher: bool = False  # a frozen teacher's logits (its `teacher` setting) come with the outputs (KD)
    scalar_head: bool = False  # the model trained is a reward model: a scalar head, saved as a sequence classifier
    # Self-play supervised algorithms: what they build from the policy's samples, and how often.
    # passing: the samples whose reward reaches a threshold; against-demonstration: (demonstration, sample) pairs;
    # best-over-worst: each prompt's best-rewarded sample over its worst.
    self_play: Literal["passing", "against-demonstration", "best-over-worst"] | None = None
    per_iteration: bool = False  # self-play: a new training set each of its `iterations`, else every step
    advantages: Estimator | None = None  # RL
    episodes: bool = False  # RL: trains on multi-turn episodes (rollout.env)
    # RL: a group whose samples all got the same reward carries no signal; it is dropped and more prompts are sampled
    # until the batch is full (DAPO's dynamic sampling, at most its `max_sampling_rounds` rounds a step)
    dynamic_sampling: bool = False
    check: Callable[[Any], None] | None = None  # its own checks of the run config, before any engine starts
    # A reference point the loss needs of each batch, from the policy's and the reference's sequence logprobs [N] of
    # its prompts paired with other examples' completions (KTO's z); the loop computes those logprobs
    kl_baseline: Callable[[torch.Tensor, torch.Tensor], float] | None = None

    @property
    def generates(self) -> bool:
        """Whether a run samples from its policy with vLLM engines."""
        return self.loop == "rl" or self.self_play is not None

    @property
    def rewards(self) -> bool:
        """Whether its samples are scored by `reward.func` (SPIN's are not: it pairs them against demonstrations)."""
        return self.loop == "rl" or self.self_play in ("passing", "best-over-worst")

    def reference_model(self, settings: Settings) -> bool:
        """Whether a frozen copy of the starting model runs beside the policy at every step."""
        return (
            self.reference == "model"
            or (self.reference == "configurable" and settings.reference == "model")
            or (self.reference == "kl" and settings.kl_coeff > 0)
        )

    def precomputed_reference(self, settings: Settings) -> bool:
        """Whether reference logprobs are computed once, before training, by the starting weights."""
        return self.reference == "configurable" and settings.reference == "precomputed"


def sequence_sums(outputs: Batch, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the sum of its response tokens' logprobs and their number, both [rows]."""
    mask = batch["response_mask"]
    return (outputs["logprobs"] * mask).sum(-1), mask.sum(-1)


def pair_sums(outputs: Batch, batch: Batch) -> tuple[torch.Tensor, ...]:
    """(chosen_logps, rejected_logps, chosen_lengths, rejected_lengths), each [N]."""
    logps, lengths = sequence_sums(outputs, batch)
    return (*logps.chunk(2), *lengths.chunk(2))


def reference_pair_loss(pair_loss: Callable, outputs: Batch, batch: Batch, args: LossArgs) -> LossResult:
    """A pair loss against reference logprobs (DPO, IPO): the policy's sequence sums and lengths, then the reference's."""
    chosen, rejected, chosen_len, rejected_len = pair_sums(outputs, batch)
    return pair_loss(chosen, rejected, *batch["ref_logps"].chunk(2), chosen_len, rejected_len, **asdict(args))


def check_iterations(config) -> None:
    """RFT and SPIN train `train.steps` split evenly over their `iterations`."""
    train = config.train
    if train.steps % train.settings.iterations:
        raise OxrlError(
            f"train.steps={train.steps}: must be a multiple of train.{train.alg}.iterations "
            f"({train.settings.iterations}); each iteration trains as many steps"
        )
