"""What every run has, whatever it trains: the run folder and its signals, the data report, tracking, the crash
report, the cluster and its actors, the step cadence (evaluation, checkpoints, a signal's stop) and the summary.

A recipe (`loops/recipes/`) says what differs: which data it reads, and what one step and one evaluation do. The
harness builds the recipe before any engine starts (it reads and checks the data then), starts the actors, and
calls the recipe's `start`, then `step` for each step. The driver (this process) owns the data order and the
bookkeeping; the DeepSpeed ranks (Ray actors, `training/group.py`) own the model, and the vLLM engines
(`rollout/pool.py`) sample from it.
"""

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from oxrl_core.algs.base import Algorithm
from oxrl_core.cluster.bundles import Reservation
from oxrl_core.cluster.session import ray_cluster
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.data.records import DataReport, report_data
from oxrl_core.loops.crash import RunPosition, crash_report
from oxrl_core.loops.run_folder import open_run_folder, save_checkpoint
from oxrl_core.loops.signals import StopSignals, stop_on_signals
from oxrl_core.models.tokenizer import load_tokenizer
from oxrl_core.resolve.run import ResolvedRun
from oxrl_core.rewards import resolve_reward, score_samples
from oxrl_core.rewards.judge import Judge
from oxrl_core.rollout.pool import RolloutPool
from oxrl_core.rollout.records import Rollout
from oxrl_core.tracking.console import training_progress
from oxrl_core.tracking.mlflow_log import MlflowLog, flatten, tracking_uri
from oxrl_core.training.build_locks import wait_for_builds
from oxrl_core.training.engine import TrainEngine
from oxrl_core.training.group import TrainGroup

StepHook = Callable[[int, dict], None]  # (step, its metrics): called after each step, before they are logged


@dataclass
class Run:
    """One run as its recipe sees it. The actors (`group`, `pool`) exist from the recipe's `start` on."""

    config: SLConfig | RLConfig
    model_path: str
    algorithm: Algorithm
    console: Console
    run_dir: Path
    state: dict  # the loop state of the checkpoint a resumed run continues, else {}
    tokenizer: Any
    pad_id: int
    reward_fn: Any  # scores samples: a function, a reward model, a judge; None where the environment scores
    reward_workers: ThreadPoolExecutor | None  # a reward function's threads (reward.workers); None: the loop's own
    summary: dict = field(default_factory=dict)
    position: RunPosition = field(default_factory=RunPosition)
    group: TrainGroup | None = None
    pool: RolloutPool | None = None

    @property
    def first_step(self) -> int:
        return self.state["step"] + 1 if self.state else 1

    def score(self, rollouts: list[Rollout], records: list[dict], step: int) -> None:
        """Set each sample's reward (`records`: each prompt's record); a reward that raises scores `reward.on_error`,
        and the error is kept in reward_errors.jsonl with its sample, the run goes on."""
        if self.reward_fn is None:  # the environment's own score
            rewards, errors = [0.0 if r.env_reward is None else r.env_reward for r in rollouts], []
        else:
            responses = [self.tokenizer.decode(r.answer_ids, skip_special_tokens=True) for r in rollouts]
            rewards, errors = score_samples(
                self.reward_fn,
                responses,
                [records[r.group] for r in rollouts],
                self.config.reward.on_error,
                self.reward_workers,
            )
        for r, reward in zip(rollouts, rewards):
            r.reward = reward
        if errors:
            with open(self.run_dir / "reward_errors.jsonl", "a") as f:
                f.writelines(json.dumps({"step": step, **e}, default=str) + "\n" for e in errors)
            self.summary["reward_errors"] = self.summary.get("reward_errors", 0) + len(errors)

    def save(self, step: int, final: bool, loop_state: dict) -> None:
        """Step `step`'s checkpoint, with the recipe's `loop_state`: what --resume needs besides the weights."""
        self.position.phase = "checkpoint"
        loop_state = loop_state | {"mlflow_run_id": self.summary["mlflow_run_id"]}
        self.summary["checkpoint"] = str(
            save_checkpoint(self.group, self.run_dir, step, final, loop_state, self.model_path)
        )


class Recipe(Protocol):
    """What differs between runs. Built with the `Run` before any engine starts: it reads and checks its data then."""

    reports: list[DataReport]  # what reading the data found, file by file
    has_val: bool  # whether it evaluates (data.val)
    throughput: str  # the metric the progress bar shows
    stopped_early: str | None  # why it stopped before train.steps, once it did

    def start(self) -> None: ...  # the actors are up: resume them, precompute what the steps need

    def step(self, step: int) -> dict: ...  # one optimizer step; its metrics

    def evaluate(self, step: int) -> dict: ...  # held-out metrics of the policy after `step` steps

    def loop_state(self) -> dict: ...  # what a checkpoint keeps of the recipe (its data order, policy version)

    def train_examples(self) -> int: ...


def run_recipe(
    resolved: ResolvedRun,
    resume: bool,
    console: Console,
    make_recipe: Callable[[Run], Recipe],
    on_step: StepHook | None = None,
) -> dict:
    """Run a resolved run to its end (or a signal's stop) and return its summary, also written to summary.json."""
    config, model_path, algorithm = resolved.config, resolved.model_path, resolved.algorithm
    run_dir, _, state, config_yaml = open_run_folder(config, resume)
    if state:
        console.print(
            f"resuming from the checkpoint of step {state['step']} ({run_dir / 'ds' / state['tag']})",
            highlight=False,
            soft_wrap=True,
        )
    # from here on a signal stops the run cleanly; the reward's threads start with its first samples, end with the run
    with (
        stop_on_signals(run_dir, console) as signals,
        ThreadPoolExecutor(config.reward.workers, thread_name_prefix="reward") as reward_workers,
    ):
        tokenizer, pad_id = load_tokenizer(model_path)
        reward_fn = None
        if algorithm.rewards:  # checked before any engine starts; None: the environment scores
            reward_fn = resolve_reward(
                config.reward.func, config.reward.kwargs, config.reward.judge if algorithm.loop == "rl" else None
            )
            (run_dir / "reward_errors.jsonl").touch()
        workers = reward_workers if config.reward.workers > 1 else None
        run = Run(config, model_path, algorithm, console, run_dir, state, tokenizer, pad_id, reward_fn, workers)
        recipe = make_recipe(run)
        report_data(recipe.reports, run_dir, console)
        params = flatten(config.model_dump(mode="json", by_alias=True))
        uri = tracking_uri(config.run.tracking_uri, config.run.output_dir)
        log = MlflowLog(uri, config.run.name, params, run_id=state.get("mlflow_run_id"))
        run.summary |= {"run_dir": str(run_dir), "steps": config.train.steps, "first_step": run.first_step}
        run.summary |= {"mlflow_run_id": log.run_id, "history": []}
        wait_for_builds()  # a build lock left on this machine would hold every rank until its hang deadline
        with (
            crash_report(run_dir, config_yaml) as run.position,
            log,
            ray_cluster(resolved.placement, config.run.hang_timeout_s) as reservation,
        ):
            run.group, run.pool = start_actors(resolved, run_dir / "logs", reservation)
            console.print(
                f"placement: {reservation.record(run_dir, run.group.ranks, run.pool.engines if run.pool else [])}"
            )
            for note in resolved.notes:
                console.print(f"note: {note}", highlight=False, soft_wrap=True)
            if isinstance(reward_fn, Judge):  # started once, beside the rollout engines; never refreshed
                reward_fn.start(reservation, run_dir, config.train.batch_size)
            if state:
                run.group.call(TrainEngine.load_checkpoint, ds_dir=run_dir / "ds", tag=state["tag"])
            recipe.start()
            start = time.perf_counter()
            last = _steps(run, recipe, signals, log, on_step)
            if recipe.has_val:
                run.summary["eval_after"] = recipe.evaluate(last)
                log.log(run.summary["eval_after"], last)
                run.summary |= {k: v for k, v in run.summary["eval_after"].items() if k == "eval_loss"}
            if config.run.save_final:
                run.save(last, final=True, loop_state=recipe.loop_state())
            run.group.shutdown()
        losses = [h["loss"] for h in run.summary["history"] if "loss" in h] or [None]
        run.summary.update(wall_time_s=time.perf_counter() - start, first_loss=losses[0], last_loss=losses[-1])
        skipped = sum(len(r.problems) for r in recipe.reports)
        run.summary.update(train_examples=recipe.train_examples(), skipped_records=skipped)
        (run_dir / "summary.json").write_text(json.dumps(run.summary, indent=2))
        return run.summary


def start_actors(
    resolved: ResolvedRun, log_dir: Path, reservation: Reservation
) -> tuple[TrainGroup, RolloutPool | None]:
    """The run's trainer ranks and, if its algorithm samples, its vLLM engines (their KV caches sized for a step's
    samples: an RL batch counts samples, a supervised one prompts)."""
    config, model_path = resolved.config, resolved.model_path
    group = TrainGroup(resolved.trainer, model_path, log_dir, reservation)
    if not resolved.algorithm.generates:
        return group, None
    step_samples = config.train.batch_size * (1 if isinstance(config, RLConfig) else config.rollout.n_samples)
    return group, RolloutPool(
        config.rollout,
        model_path,
        resolved.sampler_dtype,
        config.train.seed,
        step_samples,
        config.run.hang_timeout_s,
        log_dir,
        reservation,
        group,
        router_replay=resolved.router_replay,
    )


def _steps(run: Run, recipe: Recipe, signals: StopSignals, log: MlflowLog, on_step: StepHook | None) -> int:
    """Evaluate before a fresh run's first step, then every step with its cadence: evaluation, logging, a signal's
    stop (after a checkpoint of the step), checkpoints. Returns the last step trained."""
    config, summary = run.config, run.summary
    train, last = config.train, run.first_step - 1
    if recipe.has_val and not run.state:
        summary["eval_before"] = recipe.evaluate(last)
        log.log(summary["eval_before"], last)
    signals.steps_running = True
    with training_progress(run.console) as progress:
        bar = progress.add_task(train.alg, total=train.steps, completed=last, loss=float("nan"), tok_s=0.0)
        for step in range(run.first_step, train.steps + 1):
            run.position.step, last = step, step
            metrics = recipe.step(step)
            if recipe.has_val and train.eval_every and step % train.eval_every == 0 and step != train.steps:
                metrics |= recipe.evaluate(step)
            if on_step:
                on_step(step, metrics)
            log.log(metrics, step)
            summary["history"].append({"step": step, **metrics})
            progress.update(
                bar, completed=step, loss=metrics.get("loss", float("nan")), tok_s=metrics[recipe.throughput]
            )
            if recipe.stopped_early:
                summary["stopped_early"] = recipe.stopped_early
                break
            if signals.received:
                if config.run.save_final:
                    run.save(step, final=step == train.steps, loop_state=recipe.loop_state())
                raise signals.stop(step)
            if config.run.checkpoint_every and step % config.run.checkpoint_every == 0 and step != train.steps:
                run.save(step, final=False, loop_state=recipe.loop_state())
    return last
