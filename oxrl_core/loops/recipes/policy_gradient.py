"""Policy-gradient RL, one step top to bottom: rollout -> reward -> advantages -> train -> refresh.

After every update the new weights are streamed into the vLLM engines and the policy version goes up by one, and
every rollout records the version that produced it. Each prompt's group of samples is scored as soon as its last
sample ends, while the engines go on with the others. By default (`rollout.lag: 0`) the phases run one after the
other. At lag k the engines sample step t + k's batch while step t trains, so step t trains on the samples of the
policy of k steps earlier: the batches sampled ahead wait in `pending` (kept in checkpoints), and the refresh waits
for the engines. Asynchronous (`rollout.max_staleness: s`) nothing waits for the engines but the trainer: step t's
batch starts sampling as soon as step t - s - 1 is done, and a refresh reaches the engines mid-sample. A sample can
be an episode against an environment (`rollout.env`): a rollout concern (`rollout/episodes.py`), the same step.
"""

import base64
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, fields
from functools import partial
from typing import NoReturn

import numpy as np
import torch

from oxrl_core.algs.advantages import ESTIMATORS
from oxrl_core.algs.base import GlobalBatch, Metrics
from oxrl_core.algs.correction import importance_weights
from oxrl_core.cluster.placement import Placement
from oxrl_core.data.records import PromptExample, load_prompts
from oxrl_core.data.sampler import MixedSampler
from oxrl_core.data.sft import SFTExample, collate_sft
from oxrl_core.envs import resolve_env
from oxrl_core.errors import OxrlError
from oxrl_core.loops.crash import timed
from oxrl_core.loops.guards import check_no_trained_padding, check_policy_version, check_staleness, non_finite
from oxrl_core.loops.harness import Run
from oxrl_core.rewards.base import RewardUnavailable
from oxrl_core.rewards.judge import Judge
from oxrl_core.rewards.length import overlong_penalty
from oxrl_core.rollout.episodes import TurnTemplate, stream_episodes
from oxrl_core.rollout.records import Rollout, round_seed
from oxrl_core.training.engine import TrainEngine
from oxrl_core.training.routing import expert_load_metrics


class SamplingStopped(Exception):
    """Sampling a batch cannot go on (a reward engine failed, dynamic sampling ran out of rounds): why."""


@dataclass
class SampledBatch:
    """A step's scored samples, the prompts of their groups, and what sampling them measured."""

    rollouts: list[Rollout]
    prompts: list[tuple[int, int]]  # each group's prompt: (data source, index)
    policy_version: int  # the engines' weights while they sampled it
    metrics: dict
    seconds: dict

    def state(self) -> dict:
        """For a checkpoint (JSON): the rollouts without their media, which the prompts give back; a mixture of
        experts' routes as their int16 bytes in base64 (a list of numbers would take about four times the room)."""
        rollouts = [
            {f.name: getattr(r, f.name) for f in fields(Rollout) if f.name not in ("media", "routes")}
            | ({} if r.routes is None else {"routes": [r.routes.shape, base64.b64encode(r.routes.tobytes()).decode()]})
            for r in self.rollouts
        ]
        return {
            "rollouts": rollouts,
            "prompts": self.prompts,
            "policy_version": self.policy_version,
            "metrics": self.metrics,
            "seconds": self.seconds,
        }

    @classmethod
    def from_state(cls, state: dict, prompt_sets: list[list[PromptExample]]) -> "SampledBatch":
        prompts = [tuple(p) for p in state["prompts"]]
        rollouts = [
            Rollout(
                **{k: v for k, v in r.items() if k != "routes"},
                media=tuple(prompt_sets[prompts[r["group"]][0]][prompts[r["group"]][1]].media),
                routes=_routes(r["routes"]) if "routes" in r else None,
            )
            for r in state["rollouts"]
        ]
        return cls(rollouts, prompts, state["policy_version"], state["metrics"], state["seconds"])


def _routes(saved: list) -> np.ndarray:
    shape, data = saved
    return np.frombuffer(base64.b64decode(data), dtype=np.int16).reshape(shape).copy()


class PolicyGradient:
    throughput = "generate_tokens_per_s"

    def __init__(self, run: Run):
        """Reads and checks the prompts and the environment (before any engine starts)."""
        self.run, self.algorithm, self.train = run, run.algorithm, run.config.train
        self.settings = self.train.settings  # the algorithm's own, train.<alg>
        self.rollout, self.env = run.config.rollout, run.config.rollout.env
        env, data = self.env, run.config.data
        self.new_env = partial(resolve_env(env.name, env.kwargs), **env.kwargs) if env.name else None  # an episode's
        self.reports, self.prompt_sets = [], []
        for source in data.train:
            prompts, report = load_prompts(
                source.path, run.tokenizer, self.rollout.max_prompt_len, data.strict, self.new_env
            )
            self.prompt_sets.append(prompts)
            self.reports.append(report)
        self.val_prompts = []
        if data.val is not None:
            self.val_prompts, report = load_prompts(
                data.val, run.tokenizer, self.rollout.max_prompt_len, data.strict, self.new_env
            )
            self.reports.append(report)
        self.has_val = bool(self.val_prompts)
        self.template = TurnTemplate(run.tokenizer, self.new_env().tools) if self.new_env else None
        self.sampler = MixedSampler([len(s) for s in self.prompt_sets], [s.ratio for s in data.train], self.train.seed)
        if run.state:
            self.sampler.load_state_dict(run.state["sampler"])
        self.policy_version = run.state.get("policy_version", 0)  # updates the engines' weights have had
        self.bad_steps, self.stopped_early = 0, None
        self.lag, self.staleness = self.rollout.lag, self.rollout.max_staleness
        # the batches of the next steps, sampled ahead (rollout.lag); the sampler has drawn their prompts
        self.pending = deque(SampledBatch.from_state(b, self.prompt_sets) for b in run.state.get("pending", []))
        # Asynchronous: each step's batch being sampled, and the sampler's state before its prompts were drawn (a
        # checkpoint keeps the first untrained batch's: a resumed run samples the batches in flight again).
        self.in_flight: dict[int, Future] = {}
        self.sampler_before: dict[int, dict] = {}
        self.trained = threading.Condition()  # notified when a step ends; `last_trained` is that step
        self.last_trained = run.first_step - 1
        self.scoring = threading.Lock()  # batches sampled at once score one at a time (a judge, the errors file)
        self.drawing = threading.Lock()  # and draw their prompts one at a time

    def train_examples(self) -> int:
        return sum(len(s) for s in self.prompt_sets)

    def loop_state(self) -> dict:
        sampler = self.sampler_before.get(self.last_trained + 1, self.sampler.state_dict())
        return {"sampler": sampler, "policy_version": self.policy_version, "pending": [b.state() for b in self.pending]}

    def start(self) -> None:
        note = shared_gpus_note(self.lag, self.staleness, self.run.pool.placement)
        if note:
            self.run.console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
        if self.run.state:  # the engines started from the base weights: bring them to the checkpoint's
            self.policy_version -= 1
            self.refresh()

    def step(self, step: int) -> dict:
        run, train, rollout, start = self.run, self.train, self.rollout, time.perf_counter()
        run.position.policy_version = self.policy_version  # the trainer's version this step
        # 1. rollout and 2. reward: this step's batch; at lag k, sampled k steps ago, and step + k's is sampled now
        ahead, seconds = None, {}
        if self.staleness:
            sampled = self.take_async(step, seconds)
        else:
            while len(self.pending) < max(self.lag, 1):  # lag 0: every step; lag k: a fresh run's first k
                try:
                    self.pending.append(self.sample(step + len(self.pending), run.position.timed))
                except SamplingStopped as e:
                    self.stop(step - 1, str(e))
            sampled = self.pending.popleft()
            ahead = in_background(self.sample, step + self.lag, timed) if self.lag else None
        rollouts, metrics, seconds = sampled.rollouts, dict(sampled.metrics), dict(sampled.seconds) | seconds
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
        ages = [self.policy_version - r.policy_version for r in rollouts]
        if rollout.force_strict_on_policy:  # train on the samples of exactly the version the schedule says
            if self.staleness:
                check_staleness(ages, self.staleness)
            else:
                check_policy_version([r.policy_version for r in rollouts], sampled.policy_version)
        metrics |= {"sample_age_min": min(ages), "sample_age_mean": sum(ages) / len(ages), "sample_age_max": max(ages)}
        if self.staleness:  # samples the weights changed under
            metrics["partial_frac"] = sum(bool(r.version_starts) for r in rollouts) / len(rollouts)
        per_sample = {"rewards": rewards, "group_ids": torch.tensor([r.group for r in rollouts])}
        per_rank = rl_micro_batches(
            rollouts, per_sample, run.config.run.train_ranks, train.micro_batch_size, run.pad_id, rollout.mask_truncated
        )
        old = self.old_logprobs(per_rank, seconds)
        batches = [b for rank in per_rank for b in rank]
        metrics |= rollout_metrics(rollouts, rewards) | correct(batches, self.settings)
        # 3. advantages
        ESTIMATORS[self.algorithm.advantages](batches, self.settings)
        bad = non_finite(
            rewards=rewards,
            advantages=torch.cat([b["advantages"].flatten() for b in batches]),
            trainer_logprobs=torch.cat([o.flatten() for r in old for o in r]),
        )
        # 4. train
        if bad:
            self.bad_steps += 1
            run.console.print(
                f"[yellow]step {step} skipped:[/] non-finite {', '.join(bad)} ({self.bad_steps} in a row)"
            )
            metrics["skipped_steps"] = self.bad_steps
        else:
            self.bad_steps = 0
            metrics |= self.update(per_rank, step, seconds)
        if ahead:  # the engines finish step + k's batch under the weights they have before the refresh
            with run.position.timed(seconds, "wait_for_samples"):
                try:
                    self.pending.append(ahead.result())
                except SamplingStopped as e:
                    if not bad:  # step's update is kept: the engines take it, then the checkpoint
                        self.refresh()
                    self.stop(step, str(e))
        # 5. refresh
        if not bad:
            with run.position.timed(seconds, "refresh"):
                self.refresh()
        with self.trained:  # an asynchronous run's next batch may start
            self.last_trained = step
            self.trained.notify_all()
        metrics |= phase_metrics(seconds, metrics.pop("generated_tokens"))
        metrics |= {"policy_version": self.policy_version, "time_step_s": time.perf_counter() - start}
        if self.bad_steps >= train.max_bad_steps:
            run.console.print(
                f"[red]stopping:[/] {self.bad_steps} consecutive steps had non-finite values; checkpoint "
                f"of the last good weights follows"
            )
            self.stopped_early = f"{self.bad_steps} consecutive non-finite steps"
        return metrics

    def take_async(self, step: int, seconds: dict) -> SampledBatch:
        """Asynchronous: step `step`'s batch, once sampled. The batches of the next max_staleness steps are under way
        (their prompts drawn in step order); each starts sampling when `admitted_sample` lets it."""
        for later in range(step, min(step + self.staleness, self.train.steps) + 1):
            if later not in self.in_flight:
                with self.drawing:
                    self.sampler_before[later] = self.sampler.state_dict()
                    drawn = self.sampler.next_batch(self.train.batch_size // self.rollout.n_samples)
                self.in_flight[later] = in_background(self.admitted_sample, later, drawn)
        self.sampler_before.pop(step - 1, None)
        with self.run.position.timed(seconds, "wait_for_samples"):
            try:
                return self.in_flight.pop(step).result()
            except SamplingStopped as e:
                self.stop(step - 1, str(e))

    def admitted_sample(self, step: int, drawn: list) -> SampledBatch:
        """Step `step`'s batch, sampled once step - max_staleness - 1 is trained: by then the engines hold weights
        at most max_staleness updates older than the policy that will train on it."""
        with self.trained:
            self.trained.wait_for(lambda: self.last_trained >= step - self.staleness - 1)
        return self.sample(step, timed, drawn)

    def sample(self, step: int, timer, drawn: list | None = None) -> SampledBatch:
        """Step `step`'s scored samples, `rollout.n_samples` per prompt (`drawn`: its prompts, if drawn already),
        each prompt's group numbered in order, timed by `timer` (the run's position in the loop, or a plain clock
        beside it). With dynamic sampling (DAPO), a group whose rewards are all equal is dropped and the missing
        groups are sampled from further prompts, its `max_sampling_rounds` rounds at most; the rounds after the
        first are timed as `resample`. Raises SamplingStopped, the sampler back where it was, if the batch cannot be
        made."""
        rollout, step_start, seconds, version = self.rollout, self.sampler.state_dict(), {}, self.policy_version
        needed, kept, refs, generated, dropped = self.train.batch_size // rollout.n_samples, [], [], 0, 0
        rounds = self.settings.max_sampling_rounds if self.algorithm.dynamic_sampling else 1
        try:
            for attempt in range(rounds):
                drawn = drawn if attempt == 0 and drawn else self.draw(needed - len(kept))
                prompts = [self.prompt_sets[src][i] for src, i in drawn]
                groups = [[] for _ in prompts]
                finished = self.generate(
                    prompts, rollout.n_samples, rollout.temperature, round_seed(self.train.seed, step, attempt)
                )
                while True:  # each group scored as it ends, while the engines sample the others
                    with timer(seconds, "generate" if attempt == 0 else "resample"):
                        group = next(finished, None)
                    if group is None:
                        break
                    self.score(group, prompts, step, seconds, timer)
                    groups[group[0].group] = group
                generated += sum(len(r.response_ids) for group in groups for r in group)
                for ref, group in zip(drawn, groups):
                    if not self.algorithm.dynamic_sampling or len({r.reward for r in group}) > 1:
                        kept, refs = kept + [group], refs + [tuple(ref)]
                    else:
                        dropped += 1
                if len(kept) == needed:
                    break
            else:
                raise SamplingStopped(
                    f"dynamic sampling: after {rounds} rounds (train.{self.algorithm.name}.max_sampling_rounds) only {len(kept)} of the "
                    f"{needed} prompt groups a step needs had rewards that differ ({dropped} groups scored the same "
                    f"for every sample); use more rounds, or prompts the model solves sometimes but not always"
                )
        except SamplingStopped:
            self.sampler.load_state_dict(step_start)
            raise
        for group, samples in enumerate(kept):
            for r in samples:
                r.group = group
        metrics = {"generated_tokens": generated}
        if self.algorithm.dynamic_sampling:
            metrics |= {"groups_dropped": dropped, "sampling_rounds": attempt + 1}
        return SampledBatch([r for samples in kept for r in samples], refs, version, metrics, seconds)

    def draw(self, count: int) -> list:
        with self.drawing:
            return self.sampler.next_batch(count)

    def generate(
        self, prompts: list[PromptExample], n: int, temperature: float, seed_base: int
    ) -> Iterator[list[Rollout]]:
        """Each prompt's `n` samples (`Rollout.group`: its index in `prompts`), a group at a time as its last sample
        ends; within a group in sample order."""
        pool, top_p = self.run.pool, self.rollout.top_p
        if self.new_env:  # each sample an episode: the policy's turns and the environment's answers between them
            finished = stream_episodes(
                pool.stream,
                prompts,
                n,
                temperature,
                top_p,
                seed_base,
                self.new_env,
                self.template,
                self.env.max_turns,
                self.rollout.max_tokens,
                self.env.max_episode_tokens,
            )
        else:
            requests = pool.requests(
                [p.prompt_ids for p in prompts], n, temperature, seed_base, [p.media for p in prompts]
            )
            finished = (
                (c.key, Rollout.of(c, c.key // n, prompts[c.key // n].prompt_ids, requests[c.key].media))
                for c in pool.stream(requests, [r.key // n for r in requests])
            )
        ending = {}
        for key, rollout in finished:  # key: prompt i's j-th sample is i * n + j
            ending.setdefault(rollout.group, {})[key] = rollout
            if len(ending[rollout.group]) == n:
                yield [r for _, r in sorted(ending.pop(rollout.group).items())]

    def score(self, rollouts: list[Rollout], prompts: list[PromptExample], step: int, seconds: dict, timer) -> None:
        """Rewards, less DAPO's soft overlong penalty when `reward.overlong_buffer` is set. A reward engine that
        fails (a judge's) raises SamplingStopped."""
        run, reward_cfg = self.run, self.run.config.reward
        try:
            with self.scoring, timer(seconds, "reward"):
                run.score(rollouts, [p.record for p in prompts], step)
                if isinstance(run.reward_fn, Judge):  # part of the reward phase
                    seconds["judge"] = seconds.get("judge", 0.0) + run.reward_fn.engine_seconds
        except RewardUnavailable as e:
            raise SamplingStopped(str(e)) from None
        if reward_cfg.overlong_buffer:
            limit = self.env.max_episode_tokens if self.new_env else self.rollout.max_tokens
            for r in rollouts:
                r.reward += overlong_penalty(
                    len(r.response_ids), limit, reward_cfg.overlong_buffer, reward_cfg.overlong_penalty
                )

    def stop(self, last_trained: int, why: str) -> NoReturn:
        """End the run after step `last_trained`: its weights are kept (a checkpoint) and --resume samples the
        batch that could not be made again."""
        run = self.run
        if last_trained >= run.first_step:
            run.save(last_trained, final=False, loop_state=self.loop_state())
        raise OxrlError(
            f"{why}; stopped at step {last_trained + 1}: "
            + (
                f"step {last_trained}'s checkpoint is in {run.run_dir}, rerun with --resume to continue"
                if last_trained >= 1
                else "no step had finished, run again"
            )
        ) from None

    def old_logprobs(self, per_rank: list[list[dict]], seconds: dict) -> list[list[torch.Tensor]]:
        """The trainer's logprobs of the sampled tokens before the update (and PPO's old values, the reference's
        logprobs for a KL term), attached to the micro-batches; the logprobs are also returned."""
        group, temperature = self.run.group, self.rollout.temperature
        with self.run.position.timed(seconds, "logprobs"):
            if self.algorithm.critic:
                scored = group.call(TrainEngine.logprobs_and_values, per_rank, temperature=temperature)
                old = [[logprobs for logprobs, _ in rank] for rank in scored]
                attach(per_rank, "old_values", [[values for _, values in rank] for rank in scored])
            else:
                old = group.call(TrainEngine.token_logprobs, per_rank, temperature=temperature)
            attach(per_rank, "old_logprobs", old)
            if self.algorithm.reference_model(self.settings):
                attach(
                    per_rank,
                    "ref_logprobs",
                    group.call(TrainEngine.token_logprobs, per_rank, temperature=temperature, reference=True),
                )
        return old

    def update(self, per_rank: list[list[dict]], step: int, seconds: dict) -> dict:
        """One optimizer step on the batch; its metrics. A non-finite loss or gradient after it ends the run."""
        batch = GlobalBatch([b for r in per_rank for b in r], max_tokens=float(self.rollout.max_tokens))
        num_tokens = batch.tokens()
        with self.run.position.timed(seconds, "train"):
            results = self.run.group.call(
                TrainEngine.train_step,
                per_rank,
                loss=self.algorithm.loss,
                args=self.algorithm.args(self.settings, batch),
                temperature=self.rollout.temperature,
                with_entropy=True,
            )
        metrics = train_metrics(results, num_tokens, self.algorithm.metrics) | expert_load_metrics(
            results, self.run.run_dir, step
        )
        if non_finite(loss=torch.tensor(metrics["loss"]), grad_norm=torch.tensor(metrics["grad_norm"])):
            raise RuntimeError(
                f"step {step}: non-finite loss or gradient after the update; the weights since the last "
                f"checkpoint are not trusted and none is written"
            )
        return metrics

    def refresh(self) -> None:
        self.policy_version += 1
        self.run.pool.refresh(self.policy_version)

    def evaluate(self, step: int) -> dict:
        """Accuracy on the validation prompts (reward >= 1 counts as correct): greedy, and pass@1 estimated from
        `n_samples` samples each at the training temperature."""
        self.run.position.phase, result = "eval", {}
        for key, n, temperature in (
            ("eval_accuracy_greedy", 1, 0.0),
            ("eval_accuracy", self.rollout.n_samples, self.rollout.temperature),
        ):
            rollouts = [r for group in self.generate(self.val_prompts, n, temperature, seed_base=0) for r in group]
            with self.scoring:
                self.run.score(rollouts, [p.record for p in self.val_prompts], step)
            result[key] = sum(r.reward >= 1.0 for r in rollouts) / len(rollouts)
        return result


def shared_gpus_note(lag: int, staleness: int, placement: Placement) -> str | None:
    """What a pipelined run whose engines share the trainers' GPUs should know before it spends its steps."""
    if not (lag or staleness) or placement.mode != "colocated" or not placement.on_gpu:
        return None
    return (
        "rollout.lag / rollout.max_staleness with the engines on the trainers' GPUs (colocated): the engines and the "
        "ranks take turns on each GPU, so the overlap gains little (measured in docs/guides/pipelined-rl.md); "
        "rollout.placement=split gives the engines GPUs of their own"
    )


def in_background(fn, *args) -> Future:
    """`fn(*args)` on a thread of its own that does not hold the process up at its exit (a batch sampled ahead may
    still wait for the engines when the run ends)."""
    future = Future()

    def work():
        try:
            future.set_result(fn(*args))
        except BaseException as e:
            future.set_exception(e)

    threading.Thread(target=work, name=f"sample-{fn.__name__}", daemon=True).start()
    return future


def rl_micro_batches(
    rollouts: list[Rollout],
    per_sample: dict[str, torch.Tensor],
    ranks: int,
    size: int,
    pad_id: int,
    mask_truncated: bool,
) -> list[list[dict]]:
    """Samples cut into per-rank micro-batches: tokens, masks, the `per_sample` tensors ([B] each: advantages, or
    PPO's rewards), the sampler's logprobs placed on their prediction-aligned positions (the token at index
    len(prompt) + j is predicted at len(prompt) + j - 1) and a mixture of experts' routes on the positions of the
    tokens they routed."""
    per_rank = len(rollouts) // ranks
    batches = []
    for r in range(ranks):
        rank_batches = []
        for start in range(r * per_rank, (r + 1) * per_rank, size):
            chunk = rollouts[start : start + size]
            examples = []
            for x in chunk:
                keep = 0 if (mask_truncated and x.finish_reason == "length") else 1
                sampled = x.policy_mask or [1] * len(x.response_ids)  # an episode's environment tokens never train
                examples.append(
                    SFTExample(
                        x.prompt_ids + x.response_ids, [0] * len(x.prompt_ids) + [keep * s for s in sampled], x.media
                    )
                )
            batch = collate_sft(examples, pad_id)
            check_no_trained_padding(batch["response_mask"], batch["attention_mask"])
            sampler_logprobs = torch.zeros_like(batch["response_mask"])
            for b, x in enumerate(chunk):
                sampler_logprobs[b, len(x.prompt_ids) - 1 : len(x.prompt_ids) - 1 + len(x.response_ids)] = torch.tensor(
                    x.sampler_logprobs
                )
            batch["sampler_logprobs"] = sampler_logprobs
            if chunk[0].routes is not None:  # a mixture of experts: the engine's routes at the positions it ran
                routes = torch.full((*batch["input_ids"].shape, *chunk[0].routes.shape[1:]), -1, dtype=torch.int16)
                for b, x in enumerate(chunk):
                    routes[b, : len(x.routes)] = torch.from_numpy(x.routes)
                batch["routes"] = routes  # [B, T, L, k]
            batch |= {key: values[start : start + size].clone() for key, values in per_sample.items()}
            rank_batches.append(batch)
        batches.append(rank_batches)
    return batches


def attach(per_rank: list[list[dict]], key: str, tensors: list[list[torch.Tensor]]) -> None:
    """Put each rank's per-micro-batch tensors into its micro-batches under `key`."""
    for rank_batches, rank_tensors in zip(per_rank, tensors):
        for batch, tensor in zip(rank_batches, rank_tensors):
            batch[key] = tensor


def correct(batches: list[dict], settings) -> dict:
    """Each micro-batch's sampler-trainer correction weights (`is_weights`, its `sampler_correction`); how far vLLM's
    logprobs are from the trainer's for the same tokens (mean |delta| and KL per token), the largest raw weight of the
    step and the share of its response tokens whose weight was truncated or masked."""
    stats = [
        importance_weights(
            b["old_logprobs"],
            b["sampler_logprobs"],
            b["response_mask"],
            settings.sampler_correction,
            settings.correction_cap,
            settings.correction_floor,
        )
        for b in batches
    ]
    for b, (weights, _) in zip(batches, stats):
        b["is_weights"] = weights
    tokens = max(sum(s["tokens"] for _, s in stats), 1)
    return {
        "logprob_gap_abs": sum(s["gap_abs_sum"] for _, s in stats) / tokens,
        "logprob_gap_kl": sum(s["gap_kl_sum"] for _, s in stats) / tokens,
        "is_ratio_max": max(s["is_ratio_max"] for _, s in stats),
        "is_corrected_frac": sum(s["is_corrected_tokens"] for _, s in stats) / tokens,
    }


def rollout_metrics(rollouts: list[Rollout], rewards: torch.Tensor) -> dict:
    lengths = torch.tensor([len(r.response_ids) for r in rollouts], dtype=torch.float32)
    metrics = {
        "reward_mean": rewards.mean().item(),
        "reward_std": rewards.std(unbiased=False).item(),
        "accuracy": (rewards >= 1.0).float().mean().item(),
        "response_length": lengths.mean().item(),  # an episode's: its policy's and its environment's tokens
        "truncated_frac": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
    }
    if rollouts[0].policy_mask is not None:  # episodes: policy messages each, and the tokens the policy sampled
        metrics["turns"] = sum(
            1 + sum(a > b for a, b in zip(r.policy_mask[1:], r.policy_mask)) for r in rollouts
        ) / len(rollouts)
        metrics["policy_tokens"] = sum(sum(r.policy_mask) for r in rollouts) / len(rollouts)
    return metrics


def train_metrics(results: list[dict], num_tokens: float, loss_metrics: Metrics) -> dict:
    """The step's loss, gradient norm and rate, and its algorithm's metrics of every rank's sums."""
    sums = {key: sum(r[key] for r in results) for key in results[0] if key.endswith("_sum")} | {"tokens": num_tokens}
    metrics = {
        "loss": sum(r["loss"] for r in results),
        "grad_norm": results[0]["grad_norm"],
        "lr": results[0]["lr"],
        **loss_metrics(sums),
    }
    if "peak_memory_gb" in results[0]:  # on GPU
        metrics["trainer_peak_memory_gb"] = max(r["peak_memory_gb"] for r in results)
    return metrics


def phase_metrics(seconds: dict, generated_tokens: int) -> dict:
    out = {f"time_{phase}_s": s for phase, s in seconds.items()}
    out["generate_tokens_per_s"] = generated_tokens / max(seconds["generate"] + seconds.get("resample", 0.0), 1e-9)
    return out
