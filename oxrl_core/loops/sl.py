"""The supervised loop, top to bottom: data -> ranks -> reference -> steps -> checkpoints -> summary.

One loop for every supervised and preference algorithm; what differs is the
record format it reads, how a micro-batch is laid out, and the loss
(`algs/registry.py`). RFT, SPIN and Online DPO also sample from the policy
with vLLM engines (`rollout/pool.py`) and build their training data from
those samples: RFT and SPIN once per iteration, Online DPO at every step. The driver (this process) owns the data order and the
bookkeeping; the DeepSpeed ranks (Ray actors, `training/group.py`) own the
model. Every batch is cut here into per-rank micro-batches, so resuming needs
only the step and the sampler state (and the precomputed reference logprobs,
kept in the run folder).
"""

import json
import time
from pathlib import Path

import torch
from rich.console import Console

from oxrl_core.algs.registry import SL_ALGORITHMS, uses_reward
from oxrl_core.config.schema import SLConfig, SLTrain
from oxrl_core.checks.stability import check_policy_version
from oxrl_core.data.preference import (PairExample, UnpairedExample, collate_pairs, load_demonstrations,
                                       load_preference_examples, load_text_blocks, load_unpaired_examples)
from oxrl_core.data.records import DataReport, PromptExample, load_prompts, load_sft_examples
from oxrl_core.data.sampler import MixedSampler
from oxrl_core.data.sft import SFTExample, collate_sft
from oxrl_core.errors import OxrlError
from oxrl_core.loops.crash import crash_report
from oxrl_core.loops.run_folder import load_tokenizer, open_run_folder, report_data, save_checkpoint
from oxrl_core.loops.signals import stop_on_signals
from oxrl_core.rewards import resolve_reward, score_samples
from oxrl_core.rollout.engine import Rollout
from oxrl_core.rollout.pool import RolloutPool
from oxrl_core.tracking.console import training_progress
from oxrl_core.tracking.mlflow_log import MlflowLog, flatten, tracking_uri
from oxrl_core.training.engine import needs_reference_model
from oxrl_core.placement import ray_cluster
from oxrl_core.training.group import TrainGroup

LOADERS = {"conversations": load_sft_examples, "pairs": load_preference_examples, "unpaired": load_unpaired_examples,
           "text": load_text_blocks}
REFERENCE_FILE = "reference_logps.pt"
PAIR_LOSSES = ("dpo", "ipo", "simpo", "orpo", "rm")


def train_sl(config: SLConfig, model_path: str, resume: bool, console: Console) -> dict:
    alg = SL_ALGORITHMS[config.train.alg]
    run_dir, ds_dir, state, config_yaml = open_run_folder(config, resume)
    with stop_on_signals(run_dir, console) as signals:  # from here on a signal stops the run cleanly
        # Data: read, validate and tokenize everything before any engine starts.
        tokenizer, pad_id = load_tokenizer(model_path)
        train, rollout = config.train, config.rollout

        def load(path: Path) -> tuple[list, DataReport]:
            if alg.data == "prompts":
                return load_prompts(path, tokenizer, rollout.max_prompt_len, config.data.strict)
            if alg.data == "demonstrations":
                return load_demonstrations(path, tokenizer, config.data.max_len, rollout.max_prompt_len, config.data.strict)
            return LOADERS[alg.data](path, tokenizer, config.data.max_len, config.data.strict)

        train_sets, reports = [], []
        for source in config.data.train:
            examples, report = load(source.path)
            train_sets.append(examples)
            reports.append(report)
        val_set = []
        if config.data.val is not None:
            val_set, report = load(config.data.val)
            reports.append(report)
        report_data(reports, run_dir, console)
        reward_fn = resolve_reward(config.reward.func, config.reward.kwargs) if uses_reward(config) else None
        if alg.data == "unpaired" and len({u.desirable for s in train_sets for u in s}) < 2:
            console.print("[yellow]warning:[/] every KTO record has the same label; KTO learns from both desirable and undesirable examples")

        # RFT and SPIN train on a new generated set each iteration, each with its own sampler (made at the iteration).
        iterative = train.alg in ("rft", "spin")
        steps_per_iteration = train.steps // train.iterations
        sampler = None if iterative else MixedSampler([len(s) for s in train_sets], [s.ratio for s in config.data.train], train.seed)
        first_step = 1
        if state:
            first_step = state["step"] + 1
            if not iterative:
                sampler.load_state_dict(state["sampler"])
        log = MlflowLog(tracking_uri(config.run.tracking_uri, config.run.output_dir), config.run.name,
                        flatten(config.model_dump(mode="json")), run_id=state.get("mlflow_run_id"))

        ranks, size = config.run.train_ranks, train.micro_batch_size
        reference_model = needs_reference_model(config)
        summary = {"run_dir": str(run_dir), "steps": train.steps, "first_step": first_step, "mlflow_run_id": log.run_id,
                   "history": []}
        with crash_report(run_dir, config_yaml) as position, log, ray_cluster(config) as reservation:
            group = TrainGroup(config, model_path, run_dir / "logs", reservation)
            pool = RolloutPool(config, model_path, run_dir / "logs", reservation, group) if alg.generates else None
            console.print(f"placement: {reservation.record(run_dir, group.ranks, pool.engines if pool else [])}")
            refreshed_at = 0  # the step whose weights the vLLM engines hold (their samples' policy version)

            def refresh(step: int) -> None:
                nonlocal refreshed_at
                pool.refresh(policy_version=step)
                refreshed_at = step

            def sample(prompts: list[PromptExample], n: int, temperature: float, seed_base: int) -> list[Rollout]:
                """`n` scored samples per prompt; a reward that raises scores `reward.on_error` and is reported."""
                position.phase, position.policy_version = "sample", refreshed_at
                rollouts = pool.generate([p.prompt_ids for p in prompts], n, temperature, seed_base, [p.images for p in prompts])
                responses = [tokenizer.decode(r.response_ids, skip_special_tokens=True) for r in rollouts]
                rewards, errors = score_samples(reward_fn, responses, [prompts[r.group].record for r in rollouts],
                                                config.reward.on_error)
                for r, reward in zip(rollouts, rewards):
                    r.reward = reward
                if errors:
                    with open(run_dir / "reward_errors.jsonl", "a") as f:
                        f.writelines(json.dumps(e, default=str) + "\n" for e in errors)
                    summary["reward_errors"] = summary.get("reward_errors", 0) + len(errors)
                return rollouts

            def micro_batches(items: list, refs: list[torch.Tensor] | None) -> list[dict]:
                return [_collate(items[i:i + size], refs[i:i + size] if refs else None, pad_id) for i in range(0, len(items), size)]

            def sequence_logps(batches: list[dict], reference: bool) -> torch.Tensor:
                """Σ of the response tokens' logprobs of every row of `batches`, in order: [rows]."""
                dealt = _deal(batches, ranks)
                results = group.call("token_logprobs", dealt, reference=reference)
                # batch j went to rank j % ranks as its (j // ranks)-th micro-batch
                return torch.cat([(results[j % ranks][j // ranks] * b["response_mask"]).sum(-1) for j, b in enumerate(batches)])

            def precompute_reference(examples: list) -> list[torch.Tensor]:
                """Each example's reference logprobs under the starting weights: [2] per example
                (chosen, rejected) for pairs, (completion, mismatched completion) for KTO."""
                if isinstance(examples[0], PairExample):
                    rows = sequence_logps(micro_batches(examples, None), reference=False)
                    chosen, rejected = _pair_halves(rows, [min(size, len(examples) - i) for i in range(0, len(examples), size)])
                    return list(torch.stack([chosen, rejected], -1))
                own = sequence_logps(micro_batches([u.example for u in examples], None), reference=False)
                mismatched = sequence_logps(micro_batches([u.mismatched for u in examples], None), reference=False)
                return list(torch.stack([own, mismatched], -1))

            # Reference logprobs: computed once by the starting weights, or by the reference model at every step.
            train_refs = val_refs = None
            if alg.reference and not reference_model and not iterative:  # SPIN's come with each iteration
                if state:
                    train_refs, val_refs = torch.load(run_dir / REFERENCE_FILE)
                else:
                    console.print("computing reference logprobs of the training data ...")
                    train_refs = [precompute_reference(s) for s in train_sets]
                    val_refs = precompute_reference(val_set) if val_set else None
                    torch.save((train_refs, val_refs), run_dir / REFERENCE_FILE)

            def kto_kl_baseline(items: list[UnpairedExample], refs: list[torch.Tensor] | None) -> float:
                """KTO's z: mean log-ratio of policy to reference on prompts paired with other examples' completions."""
                batches = micro_batches([u.mismatched for u in items], None)
                policy = sequence_logps(batches, reference=False)
                reference = sequence_logps(batches, reference=True) if refs is None else torch.stack([r[1] for r in refs])
                return max(0.0, (policy - reference).mean().item())

            def prepare(items: list, refs: list[torch.Tensor] | None, training: bool) -> tuple[list[list[dict]], dict]:
                """Per-rank micro-batches of `items` with their reference logprobs, and the loss's global normalisers.
                A training batch splits evenly (config checks: batch = micro-batch x grad_accum x ranks); held-out
                data is dealt with filler."""
                batches = micro_batches(items, refs)
                per_rank = [batches[r::ranks] for r in range(ranks)] if training else _deal(batches, ranks)
                if alg.reference and reference_model:
                    results = group.call("token_logprobs", per_rank, reference=True)
                    for rank_batches, rank_logprobs in zip(per_rank, results):
                        for b, logprobs in zip(rank_batches, rank_logprobs):
                            b["ref_logps"] = (logprobs * b["response_mask"]).sum(-1)
                kl_baseline = kto_kl_baseline(items, refs) if alg.data == "unpaired" else 0.0
                return per_rank, _loss_kwargs(config.train, batches, kl_baseline)

            def start_iteration(k: int, step: int) -> tuple[list, list[torch.Tensor] | None, dict]:
                """RFT and SPIN: iteration k's training set, sampled from the policy as it is at the iteration's start, with
                its reference logprobs (SPIN) and statistics. Kept in the run folder, so a resumed run trains on it again."""
                saved = run_dir / f"iteration-{k}.pt"
                if saved.is_file():
                    return torch.load(saved, weights_only=False)
                if refreshed_at != step - 1:
                    refresh(step - 1)
                prompts, seed_base = [p for s in train_sets for p in s], train.seed * 1_000_003 + k
                if train.alg == "rft":
                    rollouts = sample(prompts, rollout.n_samples, rollout.temperature, seed_base)
                    kept = {(r.group, tuple(r.response_ids)): r for r in rollouts if r.reward >= train.rft_threshold}  # distinct
                    stats = {"rft_kept": float(len(kept)), "rft_reward_mean": sum(r.reward for r in rollouts) / len(rollouts)}
                    if not kept:
                        raise OxrlError(f"RFT iteration {k}: none of {len(rollouts)} samples scored at least train.rft_threshold="
                                        f"{train.rft_threshold} (best: {max(r.reward for r in rollouts)}); lower the threshold, "
                                        f"sample more (rollout.n_samples) or start from a stronger model")
                    data = ([_sequence(r, config.data.max_len) for r in kept.values()], None, stats)
                else:  # SPIN: the demonstration over the policy's own answer; the reference is the policy at this point
                    rollouts = pool.generate([d.prompt_ids for d in prompts], 1, rollout.temperature, seed_base,
                                             [d.chosen.images for d in prompts])
                    pairs = [PairExample(d.chosen, _sequence(r, config.data.max_len)) for d, r in zip(prompts, rollouts)]
                    data = (pairs, precompute_reference(pairs), {})
                torch.save(data, saved)
                return data

            def evaluate(step: int) -> dict:
                position.phase = "eval"
                if alg.data == "prompts":  # the policy's greedy answers to the held-out prompts, scored
                    if refreshed_at != step:
                        refresh(step)
                    rollouts = sample(val_set, 1, 0.0, seed_base=0)
                    return {"eval_reward_mean": sum(r.reward for r in rollouts) / len(rollouts)}
                per_rank, loss_kwargs = prepare(val_set, val_refs, training=False)
                sums = _summed(group.call("eval_metrics", per_rank, alg=alg.loss, loss_kwargs=loss_kwargs))
                means = {f"eval_{k}": v for k, v in _means(sums).items()}
                if alg.loss == "sft":
                    means["eval_loss"] = means.pop("eval_nll")
                return means

            def save(step: int, final: bool) -> None:
                position.phase = "checkpoint"
                loop_state = {"sampler": sampler.state_dict(), "mlflow_run_id": log.run_id}
                summary["checkpoint"] = str(save_checkpoint(group, run_dir, step, final, loop_state, model_path))

            if state:
                group.call("load_checkpoint", ds_dir=ds_dir, tag=state["tag"])
            if val_set and not state:
                summary["eval_before"] = evaluate(0)
                log.log(summary["eval_before"], 0)
            start = time.perf_counter()
            signals.steps_running = True
            step_sets = train_sets  # what the steps draw from: the data, or (RFT, SPIN) the current iteration's samples
            with training_progress(console) as progress:
                bar = progress.add_task(train.alg, total=train.steps, completed=first_step - 1, loss=float("nan"), tok_s=0.0)
                for step in range(first_step, train.steps + 1):
                    t0, position.step = time.perf_counter(), step
                    generated = {}  # statistics of the samples this step trains on
                    if iterative and (step == first_step or (step - 1) % steps_per_iteration == 0):
                        k = (step - 1) // steps_per_iteration + 1
                        examples, refs, generated = start_iteration(k, step)
                        step_sets, train_refs = [examples], [refs] if refs else None
                        sampler = MixedSampler([len(examples)], [1.0], train.seed + k)
                        if state and step == first_step and (step - 1) % steps_per_iteration:  # resumed inside iteration k
                            sampler.load_state_dict(state["sampler"])
                    if train.alg == "online-dpo":
                        prompts = [train_sets[src][i] for src, i in sampler.next_batch(train.batch_size)]
                        if refreshed_at != step - 1:
                            refresh(step - 1)
                        rollouts = sample(prompts, rollout.n_samples, rollout.temperature, train.seed * 1_000_003 + step)
                        check_policy_version([r.policy_version for r in rollouts], step - 1)
                        items, generated = _best_over_worst(rollouts, len(prompts), config.data.max_len)
                        refs = None
                    else:
                        drawn = sampler.next_batch(train.batch_size)
                        items = [step_sets[src][i] for src, i in drawn]
                        refs = [train_refs[src][i] for src, i in drawn] if train_refs else None
                    per_rank, loss_kwargs = prepare(items, refs, training=True)
                    position.phase = "train"
                    results = group.call("train_step", per_rank, alg=alg.loss, loss_kwargs=loss_kwargs)
                    elapsed = time.perf_counter() - t0
                    sums = _summed(results)
                    metrics = {
                        "loss": sums["loss"],
                        **_means(sums),
                        **generated,
                        "grad_norm": results[0]["grad_norm"],
                        "lr": results[0]["lr"],
                        "tokens_per_s": sum(float(b["attention_mask"].sum()) for r in per_rank for b in r) / elapsed,
                        "step_time_s": elapsed,
                    }
                    if "peak_memory_gb" in results[0]:  # on GPU
                        metrics["trainer_peak_memory_gb"] = max(r["peak_memory_gb"] for r in results)
                    if alg.data == "unpaired":
                        metrics["kl_baseline"] = loss_kwargs["kl_baseline"]
                    if val_set and train.eval_every and step % train.eval_every == 0 and step != train.steps:
                        metrics |= evaluate(step)
                    log.log(metrics, step)
                    summary["history"].append({"step": step, **metrics})
                    progress.update(bar, completed=step, loss=metrics["loss"], tok_s=metrics["tokens_per_s"])
                    if signals.received:
                        if config.run.save_final:
                            save(step, final=step == train.steps)
                        raise signals.stop(step)
                    if config.run.checkpoint_every and step % config.run.checkpoint_every == 0 and step != train.steps:
                        save(step, final=False)
            if val_set:
                summary["eval_after"] = evaluate(train.steps)
                log.log(summary["eval_after"], train.steps)
                summary |= {k: v for k, v in summary["eval_after"].items() if k == "eval_loss"}
            if config.run.save_final:
                save(train.steps, final=True)
            group.shutdown()
        losses = [h["loss"] for h in summary["history"]]
        summary.update(
            wall_time_s=time.perf_counter() - start,
            first_loss=losses[0] if losses else None,
            last_loss=losses[-1] if losses else None,
            train_examples=sum(len(s) for s in train_sets),
            skipped_records=sum(len(r.problems) for r in reports),
        )
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary


def _collate(items: list, refs: list[torch.Tensor] | None, pad_id: int) -> dict:
    """One micro-batch in the layout the loss reads (`algs/registry.py`): pairs as 2N rows, unpaired examples
    with their labels, plain sequences as they are."""
    if isinstance(items[0], PairExample):
        batch = collate_pairs(items, pad_id)
        if refs:  # [2N]: the chosen sides' reference logprobs, then the rejected sides'
            batch["ref_logps"] = torch.cat([torch.stack([r[0] for r in refs]), torch.stack([r[1] for r in refs])])
        return batch
    if isinstance(items[0], UnpairedExample):
        batch = collate_sft([u.example for u in items], pad_id)
        batch["desirable"] = torch.tensor([float(u.desirable) for u in items])
        if refs:
            batch["ref_logps"] = torch.stack([r[0] for r in refs])
        return batch
    return collate_sft(items, pad_id)


def _sequence(rollout: Rollout, max_len: int, trained: bool = True) -> SFTExample:
    """A sampled response after its prompt, cut to `max_len`; the mask marks the response (nothing if not `trained`)."""
    mask = [0] * len(rollout.prompt_ids) + [int(trained)] * len(rollout.response_ids)
    return SFTExample((rollout.prompt_ids + rollout.response_ids)[:max_len], mask[:max_len], rollout.images)


def _best_over_worst(rollouts: list[Rollout], num_prompts: int, max_len: int) -> tuple[list[PairExample], dict]:
    """Online DPO's pairs: per prompt, its best-rewarded sample over its worst. When all of a prompt's samples score
    the same there is no preference: its pair stays in the batch fully masked, so it counts for nothing."""
    pairs, ties = [], 0
    for g in range(num_prompts):
        samples = [r for r in rollouts if r.group == g]
        best, worst = max(samples, key=lambda r: r.reward), min(samples, key=lambda r: r.reward)
        tie = best.reward == worst.reward
        ties += tie
        pairs.append(PairExample(_sequence(best, max_len, trained=not tie), _sequence(worst, max_len, trained=not tie)))
    return pairs, {"reward_mean": sum(r.reward for r in rollouts) / len(rollouts), "tied_prompts_frac": ties / num_prompts}


def _pair_halves(rows: torch.Tensor, pairs_per_batch: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of consecutive pair micro-batches (each: N chosen rows, then N rejected) -> (chosen [P], rejected [P])."""
    chosen, rejected, start = [], [], 0
    for n in pairs_per_batch:
        chosen.append(rows[start:start + n])
        rejected.append(rows[start + n:start + 2 * n])
        start += 2 * n
    return torch.cat(chosen), torch.cat(rejected)


def _deal(batches: list[dict], ranks: int) -> list[list[dict]]:
    """Micro-batches dealt round-robin to ranks so that each runs the same number of forwards (ZeRO-3 gathers
    parameters in every one); filler batches have an empty mask and count for nothing."""
    filler = {**batches[0], "response_mask": torch.zeros_like(batches[0]["response_mask"])}
    batches = batches + [filler] * (-len(batches) % ranks)
    return [batches[r::ranks] for r in range(ranks)]


def _loss_kwargs(train: SLTrain, batches: list[dict], kl_baseline: float) -> dict:
    """The algorithm's hyper-parameters and the global batch's normalisers (all micro-batches of all ranks)."""
    masks = [b["response_mask"] for b in batches]
    tokens = sum(float(m.sum()) for m in masks)
    alg = train.alg
    if SL_ALGORITHMS[alg].loss in PAIR_LOSSES:  # rows: N chosen, then N rejected; a pair counts if both have tokens
        halves = [m.sum(-1).chunk(2) for m in masks]
        pairs = sum(float(((c > 0) & (r > 0)).sum()) for c, r in halves)
    if alg in ("sft", "cpt", "rft"):
        return {"num_tokens": tokens}
    if alg == "kd":
        return {"alpha": train.kd_alpha, "temperature": train.kd_temperature, "num_tokens": tokens}
    if alg in ("dpo", "spin", "online-dpo"):
        return {"beta": train.beta, "label_smoothing": train.label_smoothing, "num_pairs": pairs}
    if alg == "ipo":
        return {"beta": train.beta, "num_pairs": pairs}
    if alg == "simpo":
        return {"beta": train.beta, "gamma": train.simpo_gamma, "num_pairs": pairs}
    if alg == "orpo":
        chosen_tokens = sum(float(c[(c > 0) & (r > 0)].sum()) for c, r in halves)  # of the pairs that count
        return {"lam": train.orpo_lambda, "num_pairs": pairs, "num_chosen_tokens": chosen_tokens}
    if alg == "rm":
        return {"num_pairs": pairs}
    if alg == "kto":
        return {"kl_baseline": kl_baseline, "beta": train.beta, "desirable_weight": train.desirable_weight,
                "undesirable_weight": train.undesirable_weight, "num_examples": sum(float((m.sum(-1) > 0).sum()) for m in masks)}
    raise ValueError(f"no loss arguments for {alg!r}")


def _summed(results: list[dict]) -> dict:
    """Every rank's metric sums added up."""
    keys = [k for k in results[0] if k not in ("grad_norm", "lr", "peak_memory_gb")]
    return {k: sum(r[k] for r in results) for k in keys}


def _means(sums: dict) -> dict:
    """Sums over the batch -> the means reported (TRL's names for the preference metrics)."""
    means = {}
    if "pairs" in sums:
        n = max(sums["pairs"], 1.0)
        means |= {"rewards/chosen": sums["reward_chosen_sum"] / n, "rewards/rejected": sums["reward_rejected_sum"] / n,
                  "rewards/accuracies": sums["reward_correct_sum"] / n, "rewards/margins": sums["reward_margin_sum"] / n}
        if "log_odds_ratio_sum" in sums:  # ORPO: mean log odds(chosen) - log odds(rejected), TRL's log_odds_chosen
            means["log_odds_chosen"] = sums["log_odds_ratio_sum"] / n
    if "desirable" in sums:
        desirable = sums["reward_desirable_sum"] / max(sums["desirable"], 1.0)
        undesirable = sums["reward_undesirable_sum"] / max(sums["undesirable"], 1.0)
        means |= {"rewards/desirable": desirable, "rewards/undesirable": undesirable, "rewards/margins": desirable - undesirable}
    if "tokens" in sums:
        if "nll_sum" in sums:
            means["nll"] = sums["nll_sum"] / max(sums["tokens"], 1.0)
        if "kl_sum" in sums:
            means["kl"] = sums["kl_sum"] / max(sums["tokens"], 1.0)
    return means
