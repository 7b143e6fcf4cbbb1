"""A mixture of experts' routes as the engine samples them: for each request, the experts every MoE layer chose for
each token the engine ran through the model, for router replay on the trainer (training/routing.py).

vLLM calls a capture function of each layer's router with the forward's top-k experts [tokens, k] (the hook its own
recorder uses, which vLLM 0.32 serves only from its second model runner); the runner's input preparation says whose
tokens a forward holds, and at which positions. A request's routes cover its prompt and every response token but the
last (which is sampled, never run), [positions, layers, k] in the MoE layers' order; a position run again (after a
refresh or a preemption recomputes a sequence) keeps its last routing, the one its cached state came from. A prompt's
blocks that vLLM's prefix cache served come from the request that computed them, found by the block's prefix hash
(the cache is reset with every refresh, and so are these).
"""

import numpy as np
import torch

Chunk = tuple[int, np.ndarray]  # (first position, routes [tokens, layers, k])


class RouteRecorder:
    def __init__(self, llm):
        """Binds to `llm`'s model (an in-process engine core): its routers' capture functions and its runner's input
        preparation. ValueError if the model has no router vLLM lets one capture."""
        self.requests: dict[str, list[Chunk]] = {}  # each request in flight's recorded forwards
        self.prompts: dict[str, list[int]] = {}  # its prompt's block hashes (full blocks only)
        self.blocks: dict[int, np.ndarray] = {}  # a prompt block's routes [block, layers, k], by its prefix hash
        # the last forward's requests, their token counts and first positions
        self.forward: tuple[list[str], list[int], list[int]] | None = None
        self.captured: dict[int, torch.Tensor] = {}  # the last forward's top-k experts per MoE layer
        self.layers, self.top_k, self.block_size = llm.collective_rpc(self._bind, args=(self,))[0]

    @staticmethod
    def _bind(worker, recorder: "RouteRecorder") -> tuple[int, int, int]:
        from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

        runner = worker.model_runner
        if not hasattr(runner, "_prepare_inputs"):  # vLLM's second runner (GPUs with Triton) lays its batches out anew
            raise ValueError(f"{type(runner).__name__} is not the model runner whose batches this recorder reads")
        routed = sorted(
            (m.layer_id, m.router)
            for m in runner.model.modules()
            if isinstance(getattr(m, "router", None), BaseRouter) and hasattr(m, "layer_id")
        )
        if not routed:
            raise ValueError(f"{type(runner.model).__name__}: no MoE router whose choices vLLM lets one capture")
        for index, (_, router) in enumerate(routed):
            router.set_capture_fn(lambda experts, index=index: recorder.captured.__setitem__(index, experts.clone()))
        prepare = runner._prepare_inputs

        def prepare_and_note(scheduler_output, num_scheduled_tokens):
            recorder.collect()  # the forward before this one is done
            count = runner.input_batch.num_reqs
            recorder.forward = (
                [r.rsplit("-", 1)[0] for r in runner.input_batch.req_ids[:count]],  # vLLM suffixes the caller's id
                num_scheduled_tokens[:count].tolist(),
                runner.input_batch.num_computed_tokens_cpu[:count].tolist(),
            )
            return prepare(scheduler_output, num_scheduled_tokens)

        runner._prepare_inputs = prepare_and_note
        return len(routed), routed[0][1].top_k, runner.cache_config.block_size

    def start(self, key: str, prompt_ids: list[int]) -> None:
        hashes, previous = [], 0
        for end in range(self.block_size, len(prompt_ids) + 1, self.block_size):
            previous = hash((previous, tuple(prompt_ids[end - self.block_size : end])))
            hashes.append(previous)
        self.requests[key], self.prompts[key] = [], hashes

    def collect(self) -> None:
        """The last forward's routes, to the requests they belong to (idempotent: the engine calls it after a step,
        the runner before the next forward)."""
        if self.forward is None:
            return
        keys, counts, starts = self.forward
        routes = torch.stack([self.captured[i][: sum(counts)] for i in range(self.layers)], 1).to(torch.int16).numpy()
        row = 0
        for key, count, start in zip(keys, counts, starts):
            if key in self.requests:
                self.requests[key].append((start, routes[row : row + count]))
                self._keep_blocks(key, start + count)
            row += count
        self.forward, self.captured = None, {}

    def _keep_blocks(self, key: str, computed: int) -> None:
        """Every full prompt block of `key` whose positions are all recorded, for requests its prefix cache serves."""
        hashes = self.prompts[key]
        done = min(computed // self.block_size, len(hashes))
        if done and hashes[done - 1] not in self.blocks:
            routes = self.assemble(key, done * self.block_size)
            for b in range(done):
                block = routes[b * self.block_size : (b + 1) * self.block_size]
                if (block >= 0).all():
                    self.blocks.setdefault(hashes[b], block)

    def assemble(self, key: str, length: int) -> np.ndarray:
        """`key`'s routes for positions [0, length): [length, layers, k] int16, -1 where none was recorded; later
        forwards of a position over earlier ones, prefix-cached prompt blocks from the request that computed them."""
        routes = np.full((length, self.layers, self.top_k), -1, dtype=np.int16)
        for start, chunk in self.requests[key]:
            routes[start : start + len(chunk)] = chunk[: max(length - start, 0)]
        for b, h in enumerate(self.prompts[key]):
            block = slice(b * self.block_size, (b + 1) * self.block_size)
            if h in self.blocks and (routes[block] < 0).any():
                routes[block] = self.blocks[h]
        return routes

    def finish(self, key: str, length: int) -> np.ndarray:
        """A finished request's routes for its first `length` positions (prompt + response - 1), forgotten here."""
        routes = self.assemble(key, length)
        del self.requests[key], self.prompts[key]
        return routes

    def reset_prefix(self) -> None:
        """New weights: vLLM's prefix cache is reset, so are the prompt blocks it could serve."""
        self.blocks.clear()
