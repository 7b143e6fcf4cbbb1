"""A run's vLLM engines as the loops use them: sample from all of them, refresh all of them from the trainer."""

from pathlib import Path

import ray
import torch

from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.rollout.engine import Rollout, RolloutEngine, start_error
from oxrl_core.training.engine import model_dtype
from oxrl_core.training.group import TrainGroup, colocated


class RolloutPool:
    def __init__(self, config: SLConfig | RLConfig, model_path: str, log_dir: Path):
        """Starts the engines and waits for them; an engine that cannot start is one line (`start_error`)."""
        r, self.config = config.rollout, config
        if colocated(config):
            actor = ray.remote(num_gpus=0.5, num_cpus=1)(RolloutEngine)
        elif torch.cuda.is_available():
            actor = ray.remote(num_gpus=r.tensor_parallel_size, num_cpus=1)(RolloutEngine)
        else:
            actor = ray.remote(num_cpus=0.01)(RolloutEngine)
        dtype = str(model_dtype(config)).removeprefix("torch.")
        # The samples of one step, shared by the engines: an RL batch counts samples, an SL batch prompts.
        step_samples = config.train.batch_size * (1 if isinstance(config, RLConfig) else r.n_samples)
        logs = [log_dir / f"engine{i}.log" for i in range(r.engines)]
        self.engines = [actor.remote(model_path, dtype, r.max_prompt_len + r.max_tokens, r.tensor_parallel_size,
                                     r.gpu_memory_utilization, config.train.seed + i, -(-step_samples // r.engines), log)
                        for i, log in enumerate(logs)]
        for failure, log in zip(ray.get([e.start_failure.remote() for e in self.engines]), logs):
            if failure:
                raise start_error(failure, log)

    def generate(self, prompts: list[list[int]], n: int, temperature: float, seed_base: int) -> list[Rollout]:
        """`n` samples of each prompt, sorted by prompt (`Rollout.group`). Prompts are dealt round-robin to the
        engines; each prompt has its own seed, so a resumed run resamples alike. vLLM seeds a request's j-th sample
        with seed + j, so the prompts' seeds are spaced by n: every sample draws from its own random stream."""
        r = self.config.rollout
        shares = [list(range(e, len(prompts), len(self.engines))) for e in range(len(self.engines))]
        futures = [engine.generate.remote([prompts[i] for i in share], n, temperature, r.top_p, r.max_tokens,
                                          [(seed_base * 100_003 + i) * n for i in share])
                   for engine, share in zip(self.engines, shares) if share]
        rollouts = []
        for share, result in zip([s for s in shares if s], ray.get(futures)):
            for rollout in result:
                rollout.group = share[rollout.group]
                rollouts.append(rollout)
        return sorted(rollouts, key=lambda x: x.group)

    def refresh(self, group: TrainGroup, policy_version: int) -> None:
        """Stream the trainer's current weights into every engine; their samples then carry `policy_version`."""
        share_on_gpu = colocated(self.config)
        weights = group.call("named_weights", share_on_gpu=share_on_gpu)[0]  # gathered on rank 0
        ray.get([e.load_weights.remote(weights, policy_version) for e in self.engines])
        if share_on_gpu:
            group.call("release_shared_weights")
