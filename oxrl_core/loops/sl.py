"""The supervised loop, top to bottom: data -> ranks -> steps -> checkpoints -> summary.

The driver (this process) owns the data order and the bookkeeping; the
DeepSpeed ranks (Ray actors, `training/group.py`) own the model. Every batch
is cut here into per-rank micro-batches, so resuming needs only the step and
the sampler state.
"""

import json
import time
from pathlib import Path

import torch
from rich.console import Console

from oxrl_core.config.schema import SLConfig
from oxrl_core.data.records import load_sft_examples
from oxrl_core.data.sampler import MixedSampler
from oxrl_core.data.sft import SFTExample, collate_sft
from oxrl_core.loops.crash import crash_report
from oxrl_core.loops.run_folder import load_tokenizer, open_run_folder, report_data
from oxrl_core.tracking.console import training_progress
from oxrl_core.tracking.mlflow_log import MlflowLog, flatten, tracking_uri
from oxrl_core.training.group import TrainGroup, ray_cluster


def train_sl(config: SLConfig, model_path: str, resume: bool, console: Console) -> dict:
    run_dir, ds_dir, state, config_yaml = open_run_folder(config, resume)

    # Data: read, validate and tokenize everything before any engine starts.
    tokenizer, pad_id = load_tokenizer(model_path)
    train_sets, reports = [], []
    for source in config.data.train:
        examples, report = load_sft_examples(source.path, tokenizer, config.data.max_len, config.data.strict)
        train_sets.append(examples)
        reports.append(report)
    val_set = []
    if config.data.val is not None:
        val_set, report = load_sft_examples(config.data.val, tokenizer, config.data.max_len, config.data.strict)
        reports.append(report)
    report_data(reports, run_dir, console)

    sampler = MixedSampler([len(s) for s in train_sets], [s.ratio for s in config.data.train], config.train.seed)
    first_step = 1
    if state:
        sampler.load_state_dict(state["sampler"])
        first_step = state["step"] + 1
    log = MlflowLog(tracking_uri(config.run.tracking_uri, config.run.output_dir), config.run.name,
                    flatten(config.model_dump(mode="json")), run_id=state.get("mlflow_run_id"))

    train, ranks = config.train, config.run.train_ranks
    summary = {"run_dir": str(run_dir), "steps": train.steps, "first_step": first_step, "mlflow_run_id": log.run_id}
    with crash_report(run_dir, config_yaml), log, ray_cluster():
        group = TrainGroup(config, model_path, run_dir / "logs")

        def evaluate() -> float:
            results = group.call("eval_nll", _eval_batches(val_set, ranks, train.micro_batch_size, pad_id))
            return sum(r["nll_sum"] for r in results) / sum(r["tokens"] for r in results)

        def save(step: int, final: bool) -> None:
            tag = f"step-{step}"
            group.call("save_checkpoint", ds_dir=ds_dir, tag=tag)
            (ds_dir / tag / "oxrl_state.json").write_text(
                json.dumps({"step": step, "sampler": sampler.state_dict(), "mlflow_run_id": log.run_id}))
            hf_dir = run_dir / ("final" if final else f"checkpoint-{step:06d}")
            group.call("save_hf", out_dir=hf_dir, tokenizer_dir=model_path)
            (ds_dir / "latest").write_text(tag)  # written last: 'latest' always names a complete checkpoint
            summary["checkpoint"] = str(hf_dir)

        if state:
            group.call("load_checkpoint", ds_dir=ds_dir, tag=state["tag"])
        start = time.perf_counter()
        losses = []
        with training_progress(console) as progress:
            bar = progress.add_task("sft", total=train.steps, completed=first_step - 1, loss=float("nan"), tok_s=0.0)
            for step in range(first_step, train.steps + 1):
                t0 = time.perf_counter()
                batch = [train_sets[src][i] for src, i in sampler.next_batch(train.batch_size)]
                num_tokens = sum(sum(ex.target_mask[1:]) for ex in batch)
                per_rank_size = len(batch) // ranks
                per_rank = [_micro_batches(batch[r * per_rank_size:(r + 1) * per_rank_size], train.micro_batch_size, pad_id)
                            for r in range(ranks)]
                results = group.call("train_step", per_rank, alg="sft", loss_kwargs={"num_tokens": num_tokens})
                elapsed = time.perf_counter() - t0
                metrics = {
                    "loss": sum(r["loss"] for r in results),
                    "grad_norm": results[0]["grad_norm"],
                    "lr": results[0]["lr"],
                    "tokens_per_s": sum(len(ex.input_ids) for ex in batch) / elapsed,
                    "step_time_s": elapsed,
                }
                if val_set and train.eval_every and step % train.eval_every == 0 and step != train.steps:
                    metrics["eval_loss"] = evaluate()
                log.log(metrics, step)
                losses.append(metrics["loss"])
                progress.update(bar, completed=step, loss=metrics["loss"], tok_s=metrics["tokens_per_s"])
                if config.run.checkpoint_every and step % config.run.checkpoint_every == 0 and step != train.steps:
                    save(step, final=False)
        if val_set:
            summary["eval_loss"] = evaluate()
            log.log({"eval_loss": summary["eval_loss"]}, train.steps)
        save(train.steps, final=True)
        group.shutdown()
    summary.update(
        wall_time_s=time.perf_counter() - start,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        train_examples=sum(len(s) for s in train_sets),
        skipped_records=sum(len(r.problems) for r in reports),
    )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _micro_batches(examples: list[SFTExample], size: int, pad_id: int) -> list[dict]:
    return [collate_sft(examples[i:i + size], pad_id) for i in range(0, len(examples), size)]


def _eval_batches(examples: list[SFTExample], ranks: int, size: int, pad_id: int) -> list[list[dict]]:
    """Micro-batches dealt to ranks so that each runs the same number of forwards (ZeRO-3 gathers
    parameters in every one); filler batches have an empty mask and count for nothing."""
    batches = _micro_batches(examples, size, pad_id)
    filler = {**batches[0], "response_mask": torch.zeros_like(batches[0]["response_mask"])}
    batches += [filler] * (-len(batches) % ranks)
    return [batches[r::ranks] for r in range(ranks)]
