"""Offline supervised and preference training: SFT, CPT, KD, DPO, IPO, SimPO, ORPO, RM, KTO.

A step draws a batch of records, cuts it here into per-rank micro-batches in the layout its loss reads (pairs as
2N rows: the chosen sides, then the rejected), adds reference logprobs where the algorithm has them, and trains.
Resuming needs only the step and the sampler state (and the precomputed reference logprobs, kept in the run folder).
"""

import time
from pathlib import Path

import torch

from oxrl_core.algs.base import GlobalBatch, LossArgs
from oxrl_core.data.preference import (
    PairExample,
    UnpairedExample,
    collate_pairs,
    load_preference_examples,
    load_text_blocks,
    load_unpaired_examples,
)
from oxrl_core.data.records import DataReport, load_sft_examples
from oxrl_core.data.sampler import MixedSampler
from oxrl_core.data.sft import collate_sft
from oxrl_core.loops.harness import Run
from oxrl_core.training.engine import TrainEngine
from oxrl_core.training.routing import ROUTING, expert_load_metrics

LOADERS = {
    "conversations": load_sft_examples,
    "pairs": load_preference_examples,
    "unpaired": load_unpaired_examples,
    "text": load_text_blocks,
}
REFERENCE_FILE = "reference_logps.pt"


class OfflineSupervised:
    throughput = "tokens_per_s"
    stopped_early = None

    def __init__(self, run: Run):
        """Reads and checks the training and held-out data (before any engine starts)."""
        self.run, self.algorithm, self.train = run, run.algorithm, run.config.train
        self.settings = self.train.settings  # the algorithm's own, train.<alg>
        self.ranks, self.size = run.config.run.train_ranks, self.train.micro_batch_size
        loaded = [self.load(source.path) for source in run.config.data.train]
        self.train_sets, self.reports = [examples for examples, _ in loaded], [report for _, report in loaded]
        self.val_set = []
        if run.config.data.val is not None:
            self.val_set, report = self.load(run.config.data.val)
            self.reports.append(report)
        self.has_val = bool(self.val_set)
        if self.algorithm.data == "unpaired" and len({u.desirable for s in self.train_sets for u in s}) < 2:
            run.console.print(
                "[yellow]warning:[/] every KTO record has the same label; KTO learns from both desirable "
                "and undesirable examples"
            )
        self.step_sets = self.train_sets  # what the steps draw from
        self.train_refs = self.val_refs = None  # precomputed reference logprobs, per set and example
        self.sampler = self.data_order()

    def load(self, path: Path) -> tuple[list, DataReport]:
        data = self.run.config.data
        return LOADERS[self.algorithm.data](path, self.run.tokenizer, data.max_len, data.strict)

    def data_order(self) -> MixedSampler | None:
        sampler = MixedSampler(
            [len(s) for s in self.train_sets], [s.ratio for s in self.run.config.data.train], self.train.seed
        )
        if self.run.state:
            sampler.load_state_dict(self.run.state["sampler"])
        return sampler

    def train_examples(self) -> int:
        return sum(len(s) for s in self.train_sets)

    def loop_state(self) -> dict:
        return {"sampler": self.sampler.state_dict()}

    def start(self) -> None:
        """Reference logprobs computed once by the starting weights (DPO, IPO, KTO with `reference:
        precomputed`), kept in the run folder for a resumed run."""
        if not self.algorithm.precomputed_reference(self.settings):
            return
        if self.run.state:
            self.train_refs, self.val_refs = torch.load(self.run.run_dir / REFERENCE_FILE)
            return
        self.run.console.print("computing reference logprobs of the training data ...")
        self.train_refs = [self.precompute_reference(s) for s in self.train_sets]
        self.val_refs = self.precompute_reference(self.val_set) if self.val_set else None
        torch.save((self.train_refs, self.val_refs), self.run.run_dir / REFERENCE_FILE)

    def step(self, step: int) -> dict:
        start = time.perf_counter()
        items, refs, generated = self.batch(step)
        per_rank, args = self.prepare(items, refs, training=True)
        self.run.position.phase = "train"
        results = self.run.group.call(TrainEngine.train_step, per_rank, loss=self.algorithm.loss, args=args)
        elapsed = time.perf_counter() - start
        sums = summed(results)
        metrics = {
            "loss": sums["loss"],
            **self.algorithm.metrics(sums),
            **generated,
            "grad_norm": results[0]["grad_norm"],
            "lr": results[0]["lr"],
            "tokens_per_s": sum(float(b["attention_mask"].sum()) for r in per_rank for b in r) / elapsed,
            "step_time_s": elapsed,
        }
        if "peak_memory_gb" in results[0]:  # on GPU
            metrics["trainer_peak_memory_gb"] = max(r["peak_memory_gb"] for r in results)
        if self.algorithm.kl_baseline:
            metrics["kl_baseline"] = args.kl_baseline
        return metrics | expert_load_metrics(results, self.run.run_dir, step)

    def batch(self, step: int) -> tuple[list, list[torch.Tensor] | None, dict]:
        """The step's examples, their reference logprobs (or None) and statistics of how they were made."""
        drawn = self.sampler.next_batch(self.train.batch_size)
        refs = [self.train_refs[src][i] for src, i in drawn] if self.train_refs else None
        return [self.step_sets[src][i] for src, i in drawn], refs, {}

    def evaluate(self, step: int) -> dict:
        """The loss's metrics on the held-out data."""
        self.run.position.phase = "eval"
        per_rank, args = self.prepare(self.val_set, self.val_refs, training=False)
        sums = summed(self.run.group.call(TrainEngine.eval_metrics, per_rank, loss=self.algorithm.loss, args=args))
        result = {f"eval_{k}": v for k, v in self.algorithm.metrics(sums).items()}
        if set(result) == {"eval_nll"}:  # a loss that is the NLL alone (SFT, CPT) reports it as the eval loss
            result["eval_loss"] = result.pop("eval_nll")
        return result

    def prepare(
        self, items: list, refs: list[torch.Tensor] | None, training: bool
    ) -> tuple[list[list[dict]], LossArgs]:
        """Per-rank micro-batches of `items` with their reference logprobs, and the loss's arguments. A training
        batch splits evenly (batch = micro-batch x grad_accum x ranks, checked before the run); held-out data is
        dealt with filler."""
        batches = self.micro_batches(items, refs)
        per_rank = [batches[r :: self.ranks] for r in range(self.ranks)] if training else deal(batches, self.ranks)
        if self.algorithm.reference_model(self.settings):
            results = self.run.group.call(TrainEngine.token_logprobs, per_rank, reference=True)
            for rank_batches, rank_logprobs in zip(per_rank, results):
                for b, logprobs in zip(rank_batches, rank_logprobs):
                    b["ref_logps"] = (logprobs * b["response_mask"]).sum(-1)
        kl_baseline = self.kl_baseline(items, refs) if self.algorithm.kl_baseline else 0.0
        return per_rank, self.algorithm.args(self.settings, GlobalBatch(batches, kl_baseline=kl_baseline))

    def micro_batches(self, items: list, refs: list[torch.Tensor] | None) -> list[dict]:
        size = self.size
        return [
            collate(items[i : i + size], refs[i : i + size] if refs else None, self.run.pad_id)
            for i in range(0, len(items), size)
        ]

    def sequence_logps(self, batches: list[dict], reference: bool) -> torch.Tensor:
        """Σ of the response tokens' logprobs of every row of `batches`, in order: [rows]."""
        results = self.run.group.call(TrainEngine.token_logprobs, deal(batches, self.ranks), reference=reference)
        # batch j went to rank j % ranks as its (j // ranks)-th micro-batch
        return torch.cat(
            [(results[j % self.ranks][j // self.ranks] * b["response_mask"]).sum(-1) for j, b in enumerate(batches)]
        )

    def precompute_reference(self, examples: list) -> list[torch.Tensor]:
        """Each example's reference logprobs under the current weights: [2] per example (chosen, rejected) for
        pairs, (completion, mismatched completion) for KTO."""
        if isinstance(examples[0], PairExample):
            rows = self.sequence_logps(self.micro_batches(examples, None), reference=False)
            sizes = [min(self.size, len(examples) - i) for i in range(0, len(examples), self.size)]
            chosen, rejected = pair_halves(rows, sizes)
            return list(torch.stack([chosen, rejected], -1))
        own = self.sequence_logps(self.micro_batches([u.example for u in examples], None), reference=False)
        mismatched = self.sequence_logps(self.micro_batches([u.mismatched for u in examples], None), reference=False)
        return list(torch.stack([own, mismatched], -1))

    def kl_baseline(self, items: list[UnpairedExample], refs: list[torch.Tensor] | None) -> float:
        """The algorithm's reference point of the batch (KTO's z) from the policy's and the reference's sequence
        logprobs of its prompts paired with other examples' completions."""
        batches = self.micro_batches([u.mismatched for u in items], None)
        policy = self.sequence_logps(batches, reference=False)
        reference = self.sequence_logps(batches, reference=True) if refs is None else torch.stack([r[1] for r in refs])
        return self.algorithm.kl_baseline(policy, reference)


def collate(items: list, refs: list[torch.Tensor] | None, pad_id: int) -> dict:
    """One micro-batch in the layout the loss reads (`algs/base.py`): pairs as 2N rows, unpaired examples with their
    labels, plain sequences as they are."""
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


def pair_halves(rows: torch.Tensor, pairs_per_batch: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of consecutive pair micro-batches (each: N chosen rows, then N rejected) -> (chosen [P], rejected [P])."""
    chosen, rejected, start = [], [], 0
    for n in pairs_per_batch:
        chosen.append(rows[start : start + n])
        rejected.append(rows[start + n : start + 2 * n])
        start += 2 * n
    return torch.cat(chosen), torch.cat(rejected)


def deal(batches: list[dict], ranks: int) -> list[list[dict]]:
    """Micro-batches dealt round-robin to ranks so that each runs the same number of forwards (ZeRO-3 gathers
    parameters in every one); filler batches have an empty mask and count for nothing."""
    filler = {**batches[0], "response_mask": torch.zeros_like(batches[0]["response_mask"])}
    batches = batches + [filler] * (-len(batches) % ranks)
    return [batches[r::ranks] for r in range(ranks)]


def summed(results: list[dict]) -> dict:
    """Every rank's metric sums added up."""
    keys = [k for k in results[0] if k not in ("grad_norm", "lr", "peak_memory_gb", *ROUTING)]
    return {k: sum(r[k] for r in results) for k in keys}
