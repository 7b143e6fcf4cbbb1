"""Mixtures of experts on the trainer: the experts each token's router chose in a training forward, the router's
load-balancing loss as the model defines it, and the expert load a step reports.

A family with a router (`Family.router`, the class of its MoE layers' top-k router) records, in every training
forward, each layer's router logits [N, E] and chosen experts [N, k] (N: the forward's token positions, padding
included; its attention mask says which are tokens). The load-balancing loss is the model's own
`load_balancing_loss_func` (Switch Transformer's, arXiv 2101.03961, eqs. 4-6: E * sum_e f_e * P_e over the real
tokens of every layer, f_e the share of top-k choices that went to expert e, P_e its mean router probability),
added with the config's `router_aux_loss_coef` when `model.router_aux_loss` is on; it is logged either way.
"""

import importlib
import json
from contextlib import contextmanager
from pathlib import Path

import torch

ROUTING = ("expert_tokens", "router_aux_loss")  # what a rank's step reports of its routing (`step_metrics`)


class RouterRecord:
    """A model's MoE routers: within `recording`, what each of them chose in one forward; across a step, the tokens
    each expert of each layer received."""

    def __init__(self, model: torch.nn.Module, router_class: str, aux_loss_coef: float | None):
        """`aux_loss_coef`: the load-balancing loss's weight in the training loss; None: off (measured only)."""
        self.routers = [m for m in model.modules() if type(m).__name__ == router_class]
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no {router_class} module")
        self.num_experts, self.top_k = self.routers[0].num_experts, self.routers[0].top_k
        self.balancing_loss = importlib.import_module(type(self.routers[0]).__module__).load_balancing_loss_func
        self.aux_loss_coef = aux_loss_coef
        self.start_step()

    def start_step(self) -> None:
        self.tokens = torch.zeros(len(self.routers), self.num_experts, dtype=torch.long)  # [L, E]
        self.aux_losses: list[float] = []

    @contextmanager
    def recording(self, attention_mask: torch.Tensor | None):
        """Within the block, one forward; yields a list that holds, after it, the load-balancing loss of that forward
        (a tensor with its graph, for the training loss). `attention_mask` [B, T]: the forward's real tokens; None
        for a packed row, all tokens."""
        logits: list[torch.Tensor | None] = [None] * len(self.routers)
        chosen: list[torch.Tensor | None] = [None] * len(self.routers)

        def keep(layer: int):
            def hook(module, args, output):  # (router logits [N, E], top-k weights [N, k], top-k experts [N, k])
                logits[layer], chosen[layer] = output[0], output[2]

            return hook

        hooks = [router.register_forward_hook(keep(i)) for i, router in enumerate(self.routers)]
        result: list[torch.Tensor] = []
        try:
            yield result
        finally:
            for h in hooks:
                h.remove()
        real = None if attention_mask is None else attention_mask.reshape(-1).bool()
        for layer, experts in enumerate(chosen):
            picks = experts if real is None else experts[real.to(experts.device)]
            self.tokens[layer] += torch.bincount(picks.reshape(-1).cpu(), minlength=self.num_experts)
        aux = self.balancing_loss(tuple(logits), self.num_experts, self.top_k, attention_mask)
        self.aux_losses.append(float(aux.detach()))
        result.append(aux)

    def step_metrics(self) -> dict:
        """This rank's step: tokens per expert per layer, and its forwards' mean load-balancing loss."""
        return {
            "expert_tokens": self.tokens.tolist(),
            "router_aux_loss": sum(self.aux_losses) / max(len(self.aux_losses), 1),
        }


def expert_load_metrics(results: list[dict], run_dir: Path, step: int) -> dict:
    """Every rank's routing of a step (`RouterRecord.step_metrics`), as the step's metrics: the load-balancing loss
    (the ranks' mean) and, per layer, the busiest expert's tokens over the mean (1: balanced; E / k: one expert took
    every token's choice) with its mean over layers; the tokens per expert go to expert_load.jsonl. {} for a model
    without routers."""
    if "expert_tokens" not in results[0]:
        return {}
    tokens = torch.tensor([r["expert_tokens"] for r in results], dtype=torch.float64).sum(0)  # [L, E]
    busiest = tokens.max(1).values / tokens.mean(1).clamp(min=1e-12)  # [L]
    with open(run_dir / "expert_load.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "tokens_per_expert": tokens.long().tolist()}) + "\n")
    return {
        "router_aux_loss": sum(r["router_aux_loss"] for r in results) / len(results),
        "expert_load_max_over_mean": float(busiest.mean()),
        **{f"expert_load_max_over_mean/layer_{i}": float(b) for i, b in enumerate(busiest)},
    }
