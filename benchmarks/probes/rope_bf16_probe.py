"""How far RoPE's inverse frequencies computed in bf16 (what ZeRO-3's partitioned init did to them before
`rope_in_float32` in training/zero3.py) move a model's token logprobs: a probe on the CPU, never a test.

Random weights in the width of each Qwen2.5 shape (hidden size, heads, KV heads, MLP, vocabulary; 2 decoder layers,
the model in bf16), one sequence of 640 random tokens; the mean |difference| of its token logprobs between the
frequencies in bf16 and in float32, over all positions, the first 64 and the last 128.

    python benchmarks/probes/rope_bf16_probe.py [--seed S] [--shapes 0.5b 7b 32b]
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # rl_step.py lives one folder up, in benchmarks/
from rl_step import NEW_TOKENS, PROMPT_TOKENS, QWEN25_SHAPES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shapes", nargs="+", default=["0.5b", "7b", "32b"], choices=sorted(QWEN25_SHAPES))
    args = parser.parse_args()
    length = PROMPT_TOKENS + NEW_TOKENS
    for name in args.shapes:
        torch.manual_seed(args.seed)
        config = Qwen2Config(**{**QWEN25_SHAPES[name], "num_hidden_layers": 2})
        model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
        rope = model.model.rotary_emb
        in_float32 = type(rope)(config).inv_freq  # built outside any zero.Init: float32
        head_dim = config.hidden_size // config.num_attention_heads
        # Qwen2's formula with every tensor in bf16, as zero.Init's wrapped torch.arange makes it
        exponents = torch.arange(0, head_dim, 2, dtype=torch.bfloat16) / head_dim
        in_bf16 = 1.0 / (config.rope_parameters["rope_theta"] ** exponents)
        ids = torch.randint(0, config.vocab_size, (1, length))

        def logprobs(inv_freq: torch.Tensor, model=model, rope=rope, ids=ids) -> torch.Tensor:  # [length - 1]
            rope.inv_freq = inv_freq
            with torch.no_grad():
                logits = model(ids).logits.float()
            return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]

        gap = (logprobs(in_bf16) - logprobs(in_float32)).abs()
        print(
            json.dumps(
                {
                    "shape": name,
                    "seed": args.seed,
                    "layers": 2,
                    "mean_abs_gap": round(gap.mean().item(), 4),
                    "first_64": round(gap[:64].mean().item(), 4),
                    "last_128": round(gap[-128:].mean().item(), 4),
                    "inv_freq_max_rel_error": round(((in_bf16 - in_float32).abs() / in_float32).max().item(), 4),
                }
            ),
            flush=True,
        )
        del model


if __name__ == "__main__":
    main()
