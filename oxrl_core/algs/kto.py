"""KTO: Kahneman-Tversky Optimization, from unpaired good/bad examples (Ethayarajh et al. 2024, arXiv 2402.01306).

With ratio = lp - ref (sequence logprob sums) and the reference point z = max(0, KL estimate):

    desirable:   w_D * (1 - sigmoid(beta (ratio - z)))
    undesirable: w_U * (1 - sigmoid(beta (z - ratio)))

z is estimated from mismatched prompt/completion pairs (`kl_baseline`, the loop computes their logprobs) and
passed as a plain number, so it carries no gradient (as in the paper). 1 - sigmoid(x) is computed as sigmoid(-x).
"""

from dataclasses import asdict, dataclass

import torch
from pydantic import Field

from oxrl_core.algs.base import Algorithm, Batch, GlobalBatch, LossArgs, LossResult, sequence_sums
from oxrl_core.algs.settings import PositiveFloat, PreferenceBeta, ReferenceChoice


def kto_loss(
    logps: torch.Tensor,  # [N] sum of the response's token logprobs under the policy
    ref_logps: torch.Tensor,  # [N] the same sum under the frozen reference
    lengths: torch.Tensor,  # [N] response tokens; 0 on padding filler
    desirable: torch.Tensor,  # [N] 1.0 for a desirable example, 0.0 for an undesirable one
    *,
    kl_baseline: float,
    beta: float,
    desirable_weight: float,
    undesirable_weight: float,
    num_examples: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    valid = lengths > 0  # [N]
    is_desirable = valid & (desirable > 0)  # [N]
    is_undesirable = valid & (desirable == 0)  # [N]
    z = max(0.0, float(kl_baseline))  # the KL is non-negative; a negative estimate is noise
    # torch.where rather than a product: filler rows get exactly zero gradient, whatever values they hold
    ratio = torch.where(valid, logps - ref_logps, 0.0)  # [N]
    per_example = torch.where(
        is_desirable,
        desirable_weight * torch.sigmoid(-beta * (ratio - z)),
        undesirable_weight * torch.sigmoid(-beta * (z - ratio)),
    )  # [N]
    loss = torch.where(valid, per_example, 0.0).sum() / num_examples
    reward = beta * ratio  # [N]
    return loss, {
        "reward_desirable_sum": torch.where(is_desirable, reward, 0.0).sum().detach(),
        "desirable": is_desirable.sum().float(),
        "reward_undesirable_sum": torch.where(is_undesirable, reward, 0.0).sum().detach(),
        "undesirable": is_undesirable.sum().float(),
    }


@dataclass(frozen=True)
class KTOArgs(LossArgs):
    kl_baseline: float  # the KL estimate from mismatched pairs, made by the loop before the step
    beta: float
    desirable_weight: float
    undesirable_weight: float
    num_examples: float  # examples in the global batch with response tokens


def batch_loss(outputs: Batch, batch: Batch, args: KTOArgs) -> LossResult:
    logps, lengths = sequence_sums(outputs, batch)
    return kto_loss(logps, batch["ref_logps"], lengths, batch["desirable"], **asdict(args))


def kl_baseline(policy_logps: torch.Tensor, reference_logps: torch.Tensor) -> float:
    """z: the mean log-ratio of policy to reference over [N] prompts paired with other examples' completions, at
    least 0."""
    return max(0.0, (policy_logps - reference_logps).mean().item())


def kto_means(sums: dict[str, float]) -> dict[str, float]:
    """The mean implicit reward of each kind, and their margin (TRL's names)."""
    desirable = sums["reward_desirable_sum"] / max(sums["desirable"], 1.0)
    undesirable = sums["reward_undesirable_sum"] / max(sums["undesirable"], 1.0)
    return {
        "rewards/desirable": desirable,
        "rewards/undesirable": undesirable,
        "rewards/margins": desirable - undesirable,
    }


class KTOSettings(ReferenceChoice, PreferenceBeta):
    desirable_weight: PositiveFloat = Field(1.0, description="Weight of desirable examples.")
    undesirable_weight: PositiveFloat = Field(1.0, description="Weight of undesirable examples.")


def make_args(settings: KTOSettings, batch: GlobalBatch) -> KTOArgs:
    return KTOArgs(
        kl_baseline=batch.kl_baseline,
        beta=settings.beta,
        desirable_weight=settings.desirable_weight,
        undesirable_weight=settings.undesirable_weight,
        num_examples=batch.sequences_with_tokens(),
    )


ALGORITHM = Algorithm(
    "kto",
    "sl",
    "unpaired",
    batch_loss,
    make_args,
    kto_means,
    KTOSettings,
    reference="configurable",
    kl_baseline=kl_baseline,
)
