"""PPO's critic: a scalar head on the policy's last hidden state (shared backbone)."""

import torch
from torch import nn

VALUE_HEAD_FILE = "value_head.safetensors"


class PolicyWithValueHead(nn.Module):
    """Wraps a causal LM; `forward` returns (logits [B, T, V], values [B, T]).

    One module, so DeepSpeed shards, steps and checkpoints the head with the policy,
    and under ZeRO-3 the head's parameters are gathered inside the same forward.
    """

    def __init__(self, policy: nn.Module, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.policy = policy
        self.value_head = nn.Linear(hidden_size, 1, dtype=dtype)
        # Zero start: every value is 0 until the critic learns, so the first advantages are plain returns.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, **inputs):  # the policy's inputs, padded or packed (training/packing.py)
        out = self.policy(input_ids=input_ids, **inputs, output_hidden_states=True)
        return out.logits, self.value_head(out.hidden_states[-1]).squeeze(-1)
