"""Mixtures of experts on the trainer: the experts each token's router chose in a training forward, the router's
load-balancing loss as the model defines it, and the expert load a step reports.

A family with a router (`Family.router`, the class of its MoE layers' top-k router) records, in every training
forward, each layer's router logits [N, E] and chosen experts [N, k] (N: the forward's token positions, padding
included; its attention mask says which are tokens). The load-balancing loss is the model's own
`load_balancing_loss_func` (Switch Transformer's, arXiv 2101.03961, eqs. 4-6: E * sum_e f_e * P_e over the real
tokens of every layer, f_e the share of top-k choices that went to expert e, P_e its mean router probability),
added with the config's `router_aux_loss_coef` when `model.router_aux_loss` is on; it is logged either way.

Router replay (R3, Rollout Routing Replay, arXiv 2510.11370): the engine records each token's experts per layer as it
samples (rollout/routes.py), and a policy forward given them routes each token to its recorded experts instead of its
own top-k, with gate weights from the current router's probabilities at those experts (renormalised as the router
does), so that the router still receives gradients. Given routes, a forward also counts how many token-layers the
router's own top-k agrees with the engine's, replayed or not.
"""

import importlib
import json
from contextlib import contextmanager
from pathlib import Path

import torch

# what a rank's step reports of its routing (`step_metrics`)
ROUTING = ("expert_tokens", "router_aux_loss", "routes_compared", "routes_agreed")


class RouterRecord:
    """A model's MoE routers: within `recording`, what each of them chose in one forward; across a step, the tokens
    each expert of each layer received."""

    def __init__(self, model: torch.nn.Module, router_class: str, aux_loss_coef: float | None, replay: bool = False):
        """`aux_loss_coef`: the load-balancing loss's weight in the training loss; None: off (measured only).
        `replay`: forwards given the engine's routes use them (router replay); off, they only measure agreement."""
        self.routers = [m for m in model.modules() if type(m).__name__ == router_class]
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no {router_class} module")
        self.num_experts, self.top_k = self.routers[0].num_experts, self.routers[0].top_k
        self.balancing_loss = importlib.import_module(type(self.routers[0]).__module__).load_balancing_loss_func
        self.aux_loss_coef, self.replay = aux_loss_coef, replay
        self.start_step()

    def start_step(self) -> None:
        self.tokens = torch.zeros(len(self.routers), self.num_experts, dtype=torch.long)  # [L, E]
        self.aux_losses: list[float] = []
        self.compared, self.agreed = 0, 0  # token-layers with a recorded route; those the router's own top-k matched

    @contextmanager
    def recording(self, attention_mask: torch.Tensor | None, routes: torch.Tensor | None = None, count: bool = True):
        """Within the block, one forward; yields a list that holds, after it, the load-balancing loss of that forward
        (a tensor with its graph, for the training loss). `attention_mask` [B, T]: the forward's real tokens; None
        for a packed row, all tokens. `routes` [N, L, k]: the engine's experts for each of the forward's N token rows
        in the router's order (-1 where it recorded none: padding, a sequence's last token), replayed if `replay`.
        `count=False`: a forward without gradients, whose routing the step does not count."""
        logits: list[torch.Tensor | None] = [None] * len(self.routers)
        chosen: list[torch.Tensor | None] = [None] * len(self.routers)
        agreement: list[torch.Tensor] = []  # per layer: [compared, agreed], summed on the device, read once

        def keep(layer: int):
            def hook(module, args, output):  # (router logits [N, E], top-k weights [N, k], top-k experts [N, k])
                router_logits, weights, experts = output
                if routes is not None:
                    recorded = routes[:, layer].to(experts.device, torch.long)  # [N, k]
                    known = recorded[:, 0] >= 0
                    same = (recorded.sort(-1).values == experts.sort(-1).values).all(-1) & known
                    agreement.append(torch.stack([known.sum(), same.sum()]))
                    if self.replay:
                        experts = torch.where(known[:, None], recorded, experts)
                        weights = torch.softmax(router_logits, -1, dtype=torch.float).gather(-1, experts)
                        if getattr(module, "norm_topk_prob", True):  # Qwen3.5's router always renormalises
                            weights = weights / weights.sum(-1, keepdim=True)
                        weights = weights.to(router_logits.dtype)
                logits[layer], chosen[layer] = router_logits, experts
                return router_logits, weights, experts

            return hook

        hooks = [router.register_forward_hook(keep(i)) for i, router in enumerate(self.routers)]
        result: list[torch.Tensor] = []
        try:
            yield result
        finally:
            for h in hooks:
                h.remove()
        if not count:
            return
        if agreement:
            compared, agreed = torch.stack(agreement).sum(0).tolist()
            self.compared, self.agreed = self.compared + compared, self.agreed + agreed
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
            "routes_compared": self.compared,
            "routes_agreed": self.agreed,
        }


def expert_load_metrics(results: list[dict], run_dir: Path, step: int) -> dict:
    """Every rank's routing of a step (`RouterRecord.step_metrics`), as the step's metrics: the load-balancing loss
    (the ranks' mean) and, per layer, the busiest expert's tokens over the mean (1: balanced; E / k: one expert took
    every token's choice) with its mean over layers; where the engine's routes came with the samples, the share of
    token-layers whose router's own top-k chose the engine's experts (`routing_agreement`, replayed or not); the
    tokens per expert go to expert_load.jsonl. {} for a model without routers."""
    if "expert_tokens" not in results[0]:
        return {}
    tokens = torch.tensor([r["expert_tokens"] for r in results], dtype=torch.float64).sum(0)  # [L, E]
    busiest = tokens.max(1).values / tokens.mean(1).clamp(min=1e-12)  # [L]
    with open(run_dir / "expert_load.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "tokens_per_expert": tokens.long().tolist()}) + "\n")
    compared = sum(r["routes_compared"] for r in results)
    return {
        "router_aux_loss": sum(r["router_aux_loss"] for r in results) / len(results),
        "expert_load_max_over_mean": float(busiest.mean()),
        **{f"expert_load_max_over_mean/layer_{i}": float(b) for i, b in enumerate(busiest)},
        **({"routing_agreement": sum(r["routes_agreed"] for r in results) / compared} if compared else {}),
    }
