"""The RL loop, top to bottom: rollout -> reward -> advantages -> train -> refresh.

Ray holds N training actors (one DeepSpeed rank each, `training/group.py`) and
M rollout actors (one vLLM engine each, `rollout/engine.py`). The phases run
one after the other; after every update the new weights are streamed into
vLLM and the policy version goes up by one, and every rollout records the
version that produced it.
"""

import json
import time
from functools import partial

import torch
from rich.console import Console

from oxrl_core.algs.advantages import gae, group_advantages
from oxrl_core.checks.stability import check_no_trained_padding, check_policy_version, non_finite
from oxrl_core.config.schema import RLConfig
from oxrl_core.data.records import PromptExample, load_prompts
from oxrl_core.data.sampler import MixedSampler
from oxrl_core.data.sft import SFTExample, collate_sft
from oxrl_core.loops.crash import crash_report
from oxrl_core.loops.run_folder import load_tokenizer, open_run_folder, report_data, save_checkpoint
from oxrl_core.loops.signals import stop_on_signals
from oxrl_core.envs import resolve_env
from oxrl_core.errors import OxrlError
from oxrl_core.rewards import RewardUnavailable, resolve_reward, score_samples
from oxrl_core.rewards.judge import Judge
from oxrl_core.rollout.engine import Rollout
from oxrl_core.rollout.episodes import TurnTemplate, run_episodes
from oxrl_core.rollout.pool import RolloutPool
from oxrl_core.tracking.console import training_progress
from oxrl_core.tracking.mlflow_log import MlflowLog, flatten, tracking_uri
from oxrl_core.placement import ray_cluster
from oxrl_core.training.group import TrainGroup

def train_rl(config: RLConfig, model_path: str, resume: bool, console: Console) -> dict:
    train, rollout_cfg, ranks = config.train, config.rollout, config.run.train_ranks
    run_dir, ds_dir, state, config_yaml = open_run_folder(config, resume)
    with stop_on_signals(run_dir, console) as signals:  # from here on a signal stops the run cleanly
        # Prompts, the environment and the reward are checked before any engine starts.
        tokenizer, pad_id = load_tokenizer(model_path)
        env = rollout_cfg.env
        new_env = partial(resolve_env(env.name, env.kwargs), **env.kwargs) if env.name else None  # an episode's
        prompt_sets, reports = [], []
        for source in config.data.train:
            prompts, report = load_prompts(source.path, tokenizer, rollout_cfg.max_prompt_len, config.data.strict, new_env)
            prompt_sets.append(prompts)
            reports.append(report)
        val_prompts = []
        if config.data.val is not None:
            val_prompts, report = load_prompts(config.data.val, tokenizer, rollout_cfg.max_prompt_len, config.data.strict, new_env)
            reports.append(report)
        report_data(reports, run_dir, console)
        reward_fn = resolve_reward(config.reward.func, config.reward.kwargs, config.reward.judge)  # None: the environment's
        template = TurnTemplate(tokenizer, new_env().tools) if new_env else None

        prompts_per_step = train.batch_size // rollout_cfg.n_samples
        ppo = train.alg == "ppo"
        sampler = MixedSampler([len(s) for s in prompt_sets], [s.ratio for s in config.data.train], train.seed)
        first_step = 1
        if state:
            sampler.load_state_dict(state["sampler"])
            first_step = state["step"] + 1
        policy_version = state.get("policy_version", 0)
        log = MlflowLog(tracking_uri(config.run.tracking_uri, config.run.output_dir), config.run.name,
                        flatten(config.model_dump(mode="json")), run_id=state.get("mlflow_run_id"))
        summary = {"run_dir": str(run_dir), "steps": train.steps, "first_step": first_step, "mlflow_run_id": log.run_id,
                   "history": []}
        reward_errors = open(run_dir / "reward_errors.jsonl", "a")

        with crash_report(run_dir, config_yaml) as position, log, ray_cluster(config) as reservation:
            group = TrainGroup(config, model_path, run_dir / "logs", reservation)
            pool = RolloutPool(config, model_path, run_dir / "logs", reservation, group)
            console.print(f"placement: {reservation.record(run_dir, group.ranks, pool.engines)}")
            if isinstance(reward_fn, Judge):  # started once, beside the rollout engines; never refreshed
                reward_fn.start(reservation, run_dir, train.batch_size)

            def generate(prompts: list[PromptExample], n: int, temperature: float, seed_base: int) -> list[Rollout]:
                if new_env:  # each sample an episode: the policy's turns and the environment's answers between them
                    return run_episodes(pool.generate, prompts, n, temperature, seed_base, new_env, template, env.max_turns,
                                        rollout_cfg.max_tokens, env.max_episode_tokens)
                return pool.generate([p.prompt_ids for p in prompts], n, temperature, seed_base, [p.images for p in prompts])

            def score(rollouts: list[Rollout], prompts: list[PromptExample]) -> None:
                if reward_fn is None:
                    rewards, errors = [0.0 if r.env_reward is None else r.env_reward for r in rollouts], []
                else:
                    responses = [tokenizer.decode(r.answer_ids, skip_special_tokens=True) for r in rollouts]
                    rewards, errors = score_samples(reward_fn, responses, [prompts[r.group].record for r in rollouts],
                                                    config.reward.on_error)
                for r, reward in zip(rollouts, rewards):
                    r.reward = reward
                for error in errors:  # reported with the sample, the run goes on
                    reward_errors.write(json.dumps({"step": step, **error}, default=str) + "\n")
                if errors:
                    summary["reward_errors"] = summary.get("reward_errors", 0) + len(errors)

            def evaluate() -> dict:
                """Accuracy on the validation prompts (reward >= 1 counts as correct): greedy, and pass@1
                estimated from `n_samples` samples each at the training temperature."""
                position.phase, result = "eval", {}
                for key, n, temperature in (("eval_accuracy_greedy", 1, 0.0),
                                            ("eval_accuracy", rollout_cfg.n_samples, rollout_cfg.temperature)):
                    rollouts = generate(val_prompts, n, temperature, seed_base=0)
                    score(rollouts, val_prompts)
                    result[key] = sum(r.reward >= 1.0 for r in rollouts) / len(rollouts)
                return result

            def refresh() -> None:
                nonlocal policy_version
                policy_version += 1
                pool.refresh(policy_version)

            def save(step: int, final: bool) -> None:
                position.phase = "checkpoint"
                loop_state = {"sampler": sampler.state_dict(), "policy_version": policy_version, "mlflow_run_id": log.run_id}
                summary["checkpoint"] = str(save_checkpoint(group, run_dir, step, final, loop_state, model_path))

            if state:  # the engines started from the base weights: bring them to the checkpoint's
                group.call("load_checkpoint", ds_dir=ds_dir, tag=state["tag"])
                policy_version -= 1
                refresh()
            step = first_step - 1
            if val_prompts:
                summary["eval_before"] = evaluate()
                log.log(summary["eval_before"], step)
            start, bad_steps = time.perf_counter(), 0
            signals.steps_running = True
            with training_progress(console) as progress:
                bar = progress.add_task(train.alg, total=train.steps, completed=step, loss=float("nan"), tok_s=0.0)
                for step in range(first_step, train.steps + 1):
                    seconds: dict[str, float] = {}
                    position.step, position.policy_version = step, policy_version  # the version sampling this step
                    # 1. rollout
                    step_start = sampler.state_dict()
                    prompts = [prompt_sets[src][i] for src, i in sampler.next_batch(prompts_per_step)]
                    with position.timed(seconds, "generate"):
                        rollouts = generate(prompts, rollout_cfg.n_samples, rollout_cfg.temperature, seed_base=train.seed * 1_000_003 + step)
                    # 2. reward
                    try:
                        with position.timed(seconds, "reward"):
                            score(rollouts, prompts)
                    except RewardUnavailable as e:  # nothing of this step is trained: keep the last step's weights
                        sampler.load_state_dict(step_start)  # --resume samples this step's prompts again
                        if step > first_step:
                            save(step - 1, final=False)
                        raise OxrlError(f"{e}; stopped at step {step}: " + (
                            f"step {step - 1}'s checkpoint is in {run_dir}, rerun with --resume to continue"
                            if step > 1 else "no step had finished, run again")) from None
                    if isinstance(reward_fn, Judge):
                        seconds["judge"] = reward_fn.engine_seconds  # part of the reward phase
                    # 3. advantages: group-relative; PPO's come from its critic (GAE) once the old values are known
                    rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
                    per_sample = {"rewards": rewards} if ppo else \
                        {"advantages": group_advantages(rewards, torch.tensor([r.group for r in rollouts]), train.adv_std_norm)}
                    # 4. train, on the samples of exactly this policy version
                    if rollout_cfg.force_strict_on_policy:
                        check_policy_version([r.policy_version for r in rollouts], policy_version)
                    per_rank = _rl_micro_batches(rollouts, per_sample, ranks, train.micro_batch_size, pad_id,
                                                 rollout_cfg.mask_truncated)
                    with position.timed(seconds, "logprobs"):  # old logprobs (and values, reference logprobs) on the trainer
                        if ppo:
                            scored = group.call("logprobs_and_values", per_rank, temperature=rollout_cfg.temperature)
                            old = [[logprobs for logprobs, _ in rank] for rank in scored]
                            _attach(per_rank, "old_values", [[values for _, values in rank] for rank in scored])
                        else:
                            old = group.call("token_logprobs", per_rank, temperature=rollout_cfg.temperature)
                        _attach(per_rank, "old_logprobs", old)
                        if train.kl_coeff > 0:
                            _attach(per_rank, "ref_logprobs",
                                    group.call("token_logprobs", per_rank, temperature=rollout_cfg.temperature, reference=True))
                    if ppo:
                        _gae_advantages(per_rank, train)
                    bad = non_finite(rewards=rewards, advantages=torch.cat([b["advantages"].flatten() for r in per_rank for b in r]),
                                     trainer_logprobs=torch.cat([o.flatten() for r in old for o in r]))
                    metrics = _rollout_metrics(rollouts, rewards) | _sampler_trainer_gap(per_rank, old)
                    if bad:
                        bad_steps += 1
                        console.print(f"[yellow]step {step} skipped:[/] non-finite {', '.join(bad)} ({bad_steps} in a row)")
                        metrics["skipped_steps"] = bad_steps
                    else:
                        bad_steps = 0
                        num_tokens = sum(float(b["response_mask"].sum()) for r in per_rank for b in r)
                        with position.timed(seconds, "train"):
                            results = group.call("train_step", per_rank, alg=train.alg, temperature=rollout_cfg.temperature,
                                                 with_entropy=True, loss_kwargs=_loss_kwargs(config, num_tokens, len(rollouts)))
                        metrics |= _train_metrics(results, num_tokens)
                        if non_finite(loss=torch.tensor(metrics["loss"]), grad_norm=torch.tensor(metrics["grad_norm"])):
                            raise RuntimeError(f"step {step}: non-finite loss or gradient after the update; the weights since "
                                               f"the last checkpoint are not trusted and none is written")
                    # 5. refresh
                    if not bad:
                        with position.timed(seconds, "refresh"):
                            refresh()
                    metrics |= _phase_metrics(seconds, sum(len(r.response_ids) for r in rollouts))
                    metrics["policy_version"] = policy_version
                    if val_prompts and train.eval_every and step % train.eval_every == 0 and step != train.steps:
                        metrics |= evaluate()
                    log.log(metrics, step)
                    summary["history"].append({"step": step, **metrics})
                    progress.update(bar, completed=step, loss=metrics.get("loss", float("nan")), tok_s=metrics["generate_tokens_per_s"])
                    if bad_steps >= train.max_bad_steps:
                        console.print(f"[red]stopping:[/] {bad_steps} consecutive steps had non-finite values; checkpoint of the last good weights follows")
                        summary["stopped_early"] = f"{bad_steps} consecutive non-finite steps"
                        break
                    if signals.received:
                        if config.run.save_final:
                            save(step, final=step == train.steps)
                        raise signals.stop(step)
                    if config.run.checkpoint_every and step % config.run.checkpoint_every == 0 and step != train.steps:
                        save(step, final=False)
            if val_prompts:
                summary["eval_after"] = evaluate()
                log.log(summary["eval_after"], step)
            if config.run.save_final:
                save(step, final=True)
            group.shutdown()
        reward_errors.close()
        summary["wall_time_s"] = time.perf_counter() - start
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary


def _rl_micro_batches(rollouts: list[Rollout], per_sample: dict[str, torch.Tensor], ranks: int, size: int, pad_id: int,
                      mask_truncated: bool) -> list[list[dict]]:
    """Samples cut into per-rank micro-batches: tokens, masks, the `per_sample` tensors ([B] each: advantages, or
    PPO's rewards) and the sampler's logprobs placed on their prediction-aligned positions (the token at index
    len(prompt) + j is predicted at len(prompt) + j - 1)."""
    per_rank = len(rollouts) // ranks
    batches = []
    for r in range(ranks):
        rank_batches = []
        for start in range(r * per_rank, (r + 1) * per_rank, size):
            chunk = rollouts[start:start + size]
            examples = []
            for x in chunk:
                keep = 0 if (mask_truncated and x.finish_reason == "length") else 1
                sampled = x.policy_mask or [1] * len(x.response_ids)  # an episode's environment tokens never train
                examples.append(SFTExample(x.prompt_ids + x.response_ids, [0] * len(x.prompt_ids) + [keep * s for s in sampled],
                                           x.images))
            batch = collate_sft(examples, pad_id)
            check_no_trained_padding(batch["response_mask"], batch["attention_mask"])
            sampler_logprobs = torch.zeros_like(batch["response_mask"])
            for b, x in enumerate(chunk):
                sampler_logprobs[b, len(x.prompt_ids) - 1:len(x.prompt_ids) - 1 + len(x.response_ids)] = torch.tensor(x.sampler_logprobs)
            batch["sampler_logprobs"] = sampler_logprobs
            batch |= {key: values[start:start + size].clone() for key, values in per_sample.items()}
            rank_batches.append(batch)
        batches.append(rank_batches)
    return batches


def _attach(per_rank: list[list[dict]], key: str, tensors: list[list[torch.Tensor]]) -> None:
    """Put each rank's per-micro-batch tensors into its micro-batches under `key`."""
    for rank_batches, rank_tensors in zip(per_rank, tensors):
        for batch, tensor in zip(rank_batches, rank_tensors):
            batch[key] = tensor


def _gae_advantages(per_rank: list[list[dict]], train) -> None:
    """PPO: each sequence's reward sits on its last response token, less a per-token KL penalty to the reference
    when kl_coeff > 0 (InstructGPT's shaping); GAE over the old values gives advantages and returns [B, T-1].
    Unless adv_std_norm is none, advantages are whitened over all response tokens of the batch."""
    batches = [b for rank in per_rank for b in rank]
    for b in batches:
        mask = b["response_mask"]
        token_rewards = torch.zeros_like(mask)
        last = (mask * torch.arange(mask.shape[1])).argmax(-1)  # prediction-aligned index of each last token
        token_rewards[torch.arange(len(mask)), last] = b.pop("rewards") * mask.amax(-1)
        if train.kl_coeff > 0:
            token_rewards -= train.kl_coeff * (b["old_logprobs"] - b["ref_logprobs"]) * mask
        b["advantages"], b["returns"] = gae(token_rewards, b["old_values"], mask, train.gamma, train.lam)
    if train.adv_std_norm != "none":
        tokens = torch.cat([b["advantages"][b["response_mask"] > 0] for b in batches])
        mean, std = tokens.mean(), tokens.std(unbiased=False)
        for b in batches:
            b["advantages"] = (b["advantages"] - mean) / (std + 1e-6) * b["response_mask"]


def _sampler_trainer_gap(per_rank: list[list[dict]], trainer: list[list[torch.Tensor]]) -> dict:
    """How far vLLM's logprobs are from the trainer's for the same tokens: mean |delta| and a k3 KL estimate."""
    abs_sum = k3_sum = n = 0.0
    for rank_batches, rank_logprobs in zip(per_rank, trainer):
        for batch, logprobs in zip(rank_batches, rank_logprobs):
            mask = batch["response_mask"] > 0
            delta = (batch["sampler_logprobs"] - logprobs)[mask]  # log(q_sampler / p_trainer)
            abs_sum += delta.abs().sum().item()
            k3_sum += (torch.exp(-delta) + delta - 1).sum().item()  # KL(sampler || trainer), Schulman's k3
            n += mask.sum().item()
    return {"logprob_gap_abs": abs_sum / max(n, 1), "logprob_gap_kl": k3_sum / max(n, 1)}


def _loss_kwargs(config: RLConfig, num_tokens: float, num_seqs: int) -> dict:
    train = config.train
    kwargs = {"clip_low": train.clip_low, "clip_high": train.clip_high, "loss_agg": train.loss_agg,
              "num_tokens": num_tokens, "num_seqs": float(num_seqs), "max_len": float(config.rollout.max_tokens)}
    if train.alg == "sgrpo":
        kwargs["kl_coeff"] = train.kl_coeff
    if train.alg == "ppo":
        kwargs |= {"value_clip": train.value_clip, "vf_coeff": train.vf_coeff, "entropy_coeff": train.entropy_coeff}
    return kwargs


def _rollout_metrics(rollouts: list[Rollout], rewards: torch.Tensor) -> dict:
    lengths = torch.tensor([len(r.response_ids) for r in rollouts], dtype=torch.float32)
    metrics = {
        "reward_mean": rewards.mean().item(),
        "reward_std": rewards.std(unbiased=False).item(),
        "accuracy": (rewards >= 1.0).float().mean().item(),
        "response_length": lengths.mean().item(),  # an episode's: its policy's and its environment's tokens
        "truncated_frac": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
    }
    if rollouts[0].policy_mask is not None:  # episodes: policy messages each, and the tokens the policy sampled
        metrics["turns"] = sum(1 + sum(a > b for a, b in zip(r.policy_mask[1:], r.policy_mask)) for r in rollouts) / len(rollouts)
        metrics["policy_tokens"] = sum(sum(r.policy_mask) for r in rollouts) / len(rollouts)
    return metrics


def _train_metrics(results: list[dict], num_tokens: float) -> dict:
    metrics = {"loss": sum(r["loss"] for r in results), "grad_norm": results[0]["grad_norm"], "lr": results[0]["lr"],
               "clip_frac": sum(r["clip_frac_sum"] for r in results) / num_tokens,
               "entropy": sum(r["entropy_sum"] for r in results) / num_tokens}
    for name in ("kl_ref", "value_loss"):
        if f"{name}_sum" in results[0]:
            metrics[name] = sum(r[f"{name}_sum"] for r in results) / num_tokens
    if "peak_memory_gb" in results[0]:  # on GPU
        metrics["trainer_peak_memory_gb"] = max(r["peak_memory_gb"] for r in results)
    return metrics


def _phase_metrics(seconds: dict, generated_tokens: int) -> dict:
    out = {f"time_{phase}_s": s for phase, s in seconds.items()}
    out["generate_tokens_per_s"] = generated_tokens / max(seconds["generate"], 1e-9)
    return out
