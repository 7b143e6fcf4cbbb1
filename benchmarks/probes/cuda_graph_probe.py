"""Would CUDA graphs bring the training step to the GPU's own speed? A probe on a GPU, never a test.

The training phase is bound by the host (RESULTS.md: the GPU idles between the compiled layers' hundreds of small
kernel launches per micro-batch). This trains `rl_step.py`'s model (Qwen2.5-0.5B's shape, random weights, bf16) on
micro-batches of one fixed shape (16 sequences of 640 tokens, rl_step's lengths, unpacked) in plain torch (fused
AdamW on the bf16 weights, no DeepSpeed), logprobs through oxrl's fused head, each decoder layer compiled as
`compile_blocks` does, once with inductor's default mode (oxrl's today) and once with mode="reduce-overhead" (each
layer's forward and backward recorded as CUDA graphs and replayed: one launch instead of hundreds). Each mode runs
in a fresh process. Reported per mode: seconds per micro-batch (forward + backward), MFU (6 N per token, parameters
only, as RESULTS.md counts), seconds per optimizer step of ACCUM micro-batches, what the optimizer step adds to
the last micro-batch (CUDA events), peak memory. Variants also put
DeepSpeed (ZeRO-1, as rl_step.py runs oxrl) in place of plain AdamW, or compile the whole decoder stack as one graph
(cudagraph trees cannot replay one compiled layer 24 times within a forward that keeps activations for backward).

    python benchmarks/probes/cuda_graph_probe.py --out DIR [VARIANT ...]    # e.g. layers/default/deepspeed (see `train`)
"""

import argparse
import json
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import torch

PEAK_FLOPS = 989e12  # H100 SXM dense bf16
MICRO_BATCH, LENGTH, ACCUM, STEPS = 16, 640, 8, 4
SEQUENCE, PACKED_TOKENS = 639, MICRO_BATCH * LENGTH  # rl_step's sequences (128 + 511 tokens) packed, padded to a bucket


class _LayerCall(torch.nn.Module):
    """A decoder layer called with tensors only (what make_graphed_callables takes): causal attention without a mask,
    or within each packed sequence of `cu_seq_lens` (oxrl's varlen attention)."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seq_lens: torch.Tensor | None = None
    ) -> torch.Tensor:
        packed = (
            {}
            if cu_seq_lens is None
            else {
                "cu_seq_lens_q": cu_seq_lens,
                "cu_seq_lens_k": cu_seq_lens,
                "max_length_q": LENGTH,
                "max_length_k": LENGTH,
            }
        )
        return self.layer(hidden, attention_mask=None, position_embeddings=(cos, sin), **packed)


def train(model_path: str, variant: str) -> dict:
    """`variant`: "<scope>/<inductor mode>/<optimizer>". Scope: layers (each decoder layer compiled), stack (the
    whole decoder stack, one graph), graphed (each layer, compiled in `mode` unless none, captured as CUDA graphs by
    torch.cuda.make_graphed_callables: fixed shapes), packed (the micro-batch's sequences in one row of PACKED_TOKENS
    tokens, attention within each, the padding at the end a sequence of its own: fixed shapes too, as token-count
    buckets would make them) or packed-graphed. Mode: default, reduce-overhead or none. Optimizer: torch (fused
    AdamW on the bf16 weights), master (plain torch with float32 master weights: what a bf16 run needs),
    deepspeed (ZeRO-1, bf16 with float32 master weights and DeepSpeed's overflow check: `deepspeed_config` for an
    SL run), deepspeed-nocheck (the same without the check: for an RL run, as rl_step.py runs oxrl) or
    deepspeed-fp32acc (the SL run's, with the gradients accumulated in float32)."""
    from transformers import AutoModelForCausalLM

    from oxrl_core.training.attention import ATTENTION
    from oxrl_core.training.fused_head import fused_token_logprobs

    scope, mode, optimizer_kind = variant.split("/")
    packed = scope.startswith("packed")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.bfloat16, attn_implementation=ATTENTION if packed else "sdpa"
    ).cuda()
    model.config.use_cache = False
    if mode != "none":
        for block in [model.model] if scope == "stack" else model.model.layers:
            block.compile(mode=mode)
    params = sum(p.numel() for p in model.parameters())
    shape = (1, PACKED_TOKENS) if packed else (MICRO_BATCH, LENGTH)
    decoder = model.model
    if scope not in ("layers", "stack"):  # the layers one by one, as _LayerCall calls them
        if packed:  # MICRO_BATCH sequences of SEQUENCE tokens, then the padding
            ends = [SEQUENCE * (i + 1) for i in range(MICRO_BATCH)] + [PACKED_TOKENS]
            cu_seq_lens = torch.tensor([0, *ends], dtype=torch.int32, device="cuda")
            positions = torch.cat([torch.arange(b - a) for a, b in zip([0, *ends], ends)])[None].cuda()
            extra = (cu_seq_lens,)
        else:
            positions, extra = torch.arange(LENGTH, device="cuda").expand(MICRO_BATCH, -1), ()
        cos, sin = decoder.rotary_emb(torch.empty(1, dtype=torch.bfloat16, device="cuda"), positions)
        calls = tuple(_LayerCall(layer) for layer in decoder.layers)
        if scope.endswith("graphed"):
            sample = [
                (
                    torch.randn(
                        *shape, model.config.hidden_size, dtype=torch.bfloat16, device="cuda", requires_grad=True
                    ),
                    cos,
                    sin,
                    *extra,
                )
                for _ in calls
            ]
            calls = torch.cuda.make_graphed_callables(calls, tuple(sample))
        embed, norm = model.model.embed_tokens, model.model.norm

        def decoder(input_ids):
            hidden = embed(input_ids)
            for call in calls:
                hidden = call(hidden, cos, sin, *extra)
            return SimpleNamespace(last_hidden_state=norm(hidden))

    deepspeed_engine = optimizer_kind.startswith("deepspeed")
    if deepspeed_engine:
        import deepspeed

        from oxrl_core.algs.registry import ALGORITHMS
        from oxrl_core.config.schema import RLConfig, SLConfig
        from oxrl_core.resolve.checks import trainer_spec
        from oxrl_core.training.deepspeed_setup import deepspeed_config

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        # oxrl's own DeepSpeed config for this run; an RL run drops the bf16 overflow check, an SL run keeps it
        run = (RLConfig if optimizer_kind == "deepspeed-nocheck" else SLConfig).model_validate(
            {
                "data": {"train": [{"path": "unused.jsonl"}]},
                "model": {"dtype": "bfloat16"},
                "deepspeed": {"zero_stage": 1},
                "train": {
                    "batch_size": MICRO_BATCH * ACCUM,
                    "micro_batch_size": MICRO_BATCH,
                    "grad_accum": ACCUM,
                    "max_grad_norm": 1.0,
                },
            }
        )
        config = deepspeed_config(trainer_spec(run, ALGORITHMS[run.train.alg]))
        if optimizer_kind == "deepspeed-fp32acc":  # the probe's variable: micro-batch gradients summed in float32
            config["data_types"] = {"grad_accum_dtype": "fp32"}
        engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=list(model.parameters()),
            optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-6, fused=True),
            config=config,
        )
        backward, step = engine.backward, engine.step  # DeepSpeed scales by ACCUM and steps at the boundary
    elif optimizer_kind == "master":  # what DeepSpeed's bf16 does, in plain torch: float32 master weights
        weights = list(model.parameters())
        masters = [w.detach().float() for w in weights]
        optimizer = torch.optim.AdamW(masters, lr=1e-6, fused=True)
        backward = lambda loss: (loss / ACCUM).backward()

        def step():  # the bf16 gradients cast to the masters, clipped (no read on the host), AdamW, copied back
            for master, weight in zip(masters, weights):
                master.grad = weight.grad.float()
            torch.nn.utils.clip_grad_norm_(masters, 1.0, foreach=True)
            optimizer.step()
            torch._foreach_copy_([weight.data for weight in weights], masters)
            torch._foreach_zero_([weight.grad for weight in weights])
            for master in masters:
                master.grad = None
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
        backward = lambda loss: (loss / ACCUM).backward()

        def step():
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)  # the gradients keep their memory (and addresses) across steps

    batches = [torch.randint(0, 151_000, shape, device="cuda") for _ in range(ACCUM)]
    advantages = torch.randn(shape[0], shape[1] - 1, device="cuda")

    # Timed on the GPU's own timeline (CUDA events, no host sync between micro-batches): each accumulating
    # micro-batch, and the last one with the optimizer step (DeepSpeed steps inside its last `step()` call).
    step_s, micro_s, boundary_s = [], [], []
    for n in range(STEPS):
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(ACCUM + 1)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        marks[0].record()
        for i, ids in enumerate(batches):
            hidden = decoder(input_ids=ids).last_hidden_state
            logprobs, _ = fused_token_logprobs(hidden, model.lm_head.weight, ids)
            backward(-(logprobs * advantages).mean())
            if deepspeed_engine or i == ACCUM - 1:
                step()
            marks[i + 1].record()
        torch.cuda.synchronize()
        if n:  # the first compiles and records
            step_s.append(time.perf_counter() - start)
            intervals = [a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])]
            micro_s.append(statistics.median(intervals[:-1]))
            boundary_s.append(intervals[-1])
    seconds = statistics.median(micro_s)
    return {
        "variant": variant,
        "params": params,
        "micro_batch_s": seconds,
        "step_s": statistics.median(step_s),
        "optimizer_step_s": statistics.median(boundary_s) - seconds,  # the last micro-batch's excess
        "mfu": 6 * params * MICRO_BATCH * LENGTH / seconds / PEAK_FLOPS,
        "step_mfu": 6 * params * MICRO_BATCH * LENGTH * ACCUM / statistics.median(step_s) / PEAK_FLOPS,
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30,
    }


def main() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # rl_step.py lives one folder up, in benchmarks/
    from rl_step import QWEN25_SHAPES, build_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "variants",
        nargs="*",
        default=["layers/default/torch", "layers/reduce-overhead/torch"],
        help="<layers|stack|graphed|packed|packed-graphed>/<default|reduce-overhead|none>/"
        "<torch|master|deepspeed|deepspeed-nocheck|deepspeed-fp32acc>",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = build_model(args.out / "qwen2.5-0.5b-shape", QWEN25_SHAPES["0.5b"])
    results = []
    for variant in args.variants:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            try:
                results.append(pool.submit(train, str(model), variant).result())
            except Exception as e:  # a variant that fails is a result too
                results.append({"variant": variant, "error": f"{type(e).__name__}: {str(e)[:2000]}"})
        print(json.dumps(results[-1]), flush=True)
    (args.out / "cuda_graph_probe.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
