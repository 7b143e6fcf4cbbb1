"""The output layer fused with the log-softmax: per-token logprobs straight from the last hidden states.

Unfused, the hidden states [B, T, H] times the output layer's weight [V, H] are logits
[B, T, V], then log-softmaxed: with Qwen's 152k vocabulary a micro-batch of 8 x 640
tokens makes 1.5 GB of bf16 logits, and their gradient as much again. Here they never
exist whole; a chunk of them (at most CHUNK entries) does, at one time:

- forward: a few positions at a time (whole rows, as the softmax needs them), logits
  [n, V] = hidden @ W^T in the weight's dtype (as `nn.Linear` makes them), then the row
  functions of `logprobs.py` (the Triton kernels on CUDA). Kept per position: the
  logsumexp, and the entropy when asked.
- backward: the logits are made again, since an RL loss's gradient exists only now
  (unlike cross-entropy's, which is known in the forward). With each row's logsumexp
  known, they are made by slices of the vocabulary [N, v]: each slice's gradient of the
  logits, g = (onehot - p) * grad / T (+ the entropy's term), gives its part of grad_W
  = g^T hidden in one product, and adds g @ W[slice] to grad_hidden [N, H], kept in
  float32 across slices. No [V, H] float32 accumulator.

Under ZeRO-3 the weight is a shard outside its module's forward: `LogprobsHead` takes the
place of the model's output layer, so the fused op runs inside the model's own call to it,
where DeepSpeed's hooks gather the weight (and again before its backward).
"""

from contextlib import contextmanager

import torch
from torch import nn
from torch.nn import functional as F

from oxrl_core.training.logprobs import rows_backward, rows_forward

# Logits per chunk: 256 MB in bf16 (512 MB as float32 rows on CPU). Measured on an H100 at Qwen2.5-0.5B's shape
# (16 x 640 tokens, fwd + bwd): 2**26 takes 1.08x the time of 2**27, which is as fast as 2**28 and 2**29 for 0.5 GB less
# memory than 2**28. A chunk's width (rows in the forward, vocabulary columns in the backward) is a multiple of ALIGN:
# a backward slice of v columns is the row stride of its [N, v] gradient, and cuBLAS's fast bf16 kernels need strides
# of a multiple of 8 elements (at N = 10224, 2**28 // N = 26255 columns made the head 3.6x slower).
CHUNK = 2**27
ALIGN = 128


def width(other: int) -> int:
    """The rows (or columns) of a chunk [width, other] of at most CHUNK entries: a multiple of ALIGN when above it."""
    width = max(1, CHUNK // other)
    return width - width % ALIGN if width > ALIGN else width


def fused_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """hidden [B, T, H] (the last hidden states, after the final norm), weight [V, H] (the output layer's, no bias),
    input_ids [B, T] -> logprobs [B, T-1] with out[b, t] = log p(x[b, t+1] | x[b, :t+1]), p = softmax(hidden @ W^T / T),
    and the entropies of p [B, T-1] when asked (else None); both with gradients (for hidden and weight)."""
    batch, length, size = hidden.shape
    rows = hidden[:, :-1].reshape(-1, size)  # [N, H], N = B (T-1): the positions that predict a token
    logprobs, entropy = _FusedLogprobs.apply(rows, weight, input_ids[:, 1:].reshape(-1), temperature, with_entropy)
    return logprobs.view(batch, length - 1), entropy.view(batch, length - 1) if with_entropy else None


class _FusedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, with_entropy):  # [N, H], [V, H], [N], float, bool
        step = width(len(weight))
        chunks = [
            rows_forward(
                F.linear(hidden[start : start + step], weight)[None],  # logits [1, n, V]
                targets[None, start : start + step],
                temperature,
                with_entropy,
            )
            for start in range(0, len(hidden), step)
        ]
        picked, lse, entropy = (torch.cat([c[i].flatten() for c in chunks]) for i in range(3))  # [N] ([0]: no entropy)
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an entropy reported as a metric has no gradient: None, not zeros
        return picked, entropy

    @staticmethod
    def backward(ctx, grad, grad_entropy):  # [N] each, or None
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[:2]  # a frozen weight (LoRA) needs no grad_W
        grad_hidden = torch.zeros(hidden.shape, dtype=lse.dtype, device=hidden.device) if want_hidden else None
        grad_weight = torch.empty_like(weight) if want_weight else None
        vocab = len(weight)
        step = width(len(hidden))
        for start in range(0, vocab, step):
            w = weight[start : start + step]  # [v, H]
            g = F.linear(hidden, w)  # [N, v], then overwritten by its own gradient
            rows_backward(
                g[None],
                (targets - start)[None],
                lse[None],
                None if grad is None else grad[None],
                ctx.temperature,
                entropy[None],
                None if grad_entropy is None else grad_entropy[None],
                g[None],
            )
            if want_weight:
                torch.mm(g.T, hidden, out=grad_weight[start : start + step])
            if want_hidden:
                grad_hidden += (g @ w).to(grad_hidden.dtype)
        return None if grad_hidden is None else grad_hidden.to(hidden.dtype), grad_weight, None, None, None


class LogprobsHead(nn.Module):
    """A causal LM's output layer in place of its bias-free `nn.Linear`: the same weight Parameter under the same name,
    so checkpoints, tied embeddings and ZeRO-3's partitioning see nothing new. The model's forward calls it as it
    called the linear layer, and gets logits from it, or inside `scoring`, (logprobs, entropy) of `fused_token_logprobs`
    in their place: so under ZeRO-3 the fused op runs where DeepSpeed's hooks around this module have gathered the
    weight, and its backward where they gather it again."""

    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight
        self._scoring = None  # (input_ids, temperature, with_entropy) while `scoring`

    @classmethod
    def replace_output_layer(cls, causal_lm: nn.Module) -> "LogprobsHead | None":
        """Put a LogprobsHead in place of `causal_lm`'s output layer (before DeepSpeed wraps it) when that is a plain
        nn.Linear without bias (Qwen, Llama); None otherwise (a LoRA adapter on it, a bias, logits the model changes
        after it: Gemma 2's soft-capping): those keep the logits."""
        layer = causal_lm.get_output_embeddings()
        if type(layer) is not nn.Linear or layer.bias is not None:
            return None
        if getattr(causal_lm.config.get_text_config(), "final_logit_softcapping", None):
            return None
        head = cls(layer.weight)
        causal_lm.set_output_embeddings(head)
        return head

    @contextmanager
    def scoring(self, input_ids: torch.Tensor, temperature: float, with_entropy: bool):
        """While open, a model call returns (logprobs [B, T-1], entropy [B, T-1] or None) of `input_ids` [B, T] where
        its logits would be."""
        self._scoring = input_ids, temperature, with_entropy
        try:
            yield
        finally:
            self._scoring = None

    @torch.compiler.disable  # its own chunked kernels; compiled models break their graph here (no guards on _scoring)
    def forward(self, hidden: torch.Tensor):  # [B, T, H]
        if self._scoring is None:
            return F.linear(hidden, self.weight)  # [B, T, V]
        return fused_token_logprobs(hidden, self.weight, *self._scoring)
