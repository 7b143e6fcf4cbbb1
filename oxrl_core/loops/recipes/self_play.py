"""Self-play supervised training: the policy's own vLLM samples become its training data (`Algorithm.self_play`).

RFT keeps its samples that pass a reward threshold, SPIN pairs demonstrations over its samples, both building a new
training set at the start of each of its `iterations`; Online DPO pairs each prompt's best sample over its worst at
every step. The steps then train as offline supervised ones do (`supervised.py`).
"""

from pathlib import Path

import torch

from oxrl_core.data.preference import PairExample, load_demonstrations
from oxrl_core.data.records import DataReport, PromptExample, load_prompts
from oxrl_core.data.sampler import MixedSampler
from oxrl_core.data.sft import SFTExample
from oxrl_core.errors import OxrlError
from oxrl_core.loops.guards import check_policy_version
from oxrl_core.loops.recipes.supervised import OfflineSupervised
from oxrl_core.rollout.records import Rollout, round_seed


class SelfPlaySupervised(OfflineSupervised):
    def __init__(self, run):
        self.refreshed_at = 0  # the step whose weights the vLLM engines hold (their samples' policy version)
        super().__init__(run)

    def load(self, path: Path) -> tuple[list, DataReport]:
        data, rollout = self.run.config.data, self.run.config.rollout
        if self.algorithm.data == "prompts":
            return load_prompts(path, self.run.tokenizer, rollout.max_prompt_len, data.strict)
        return load_demonstrations(path, self.run.tokenizer, data.max_len, rollout.max_prompt_len, data.strict)

    def data_order(self) -> MixedSampler | None:
        """Per iteration (RFT, SPIN), each iteration's set has a sampler of its own, made with the set."""
        return None if self.algorithm.per_iteration else super().data_order()

    def batch(self, step: int) -> tuple[list, list[torch.Tensor] | None, dict]:
        train, rollout = self.train, self.run.config.rollout
        if self.algorithm.self_play == "best-over-worst":
            prompts = [self.train_sets[src][i] for src, i in self.sampler.next_batch(train.batch_size)]
            self.policy_at(step - 1)
            rollouts = self.sample(prompts, rollout.n_samples, rollout.temperature, round_seed(train.seed, step), step)
            check_policy_version([r.policy_version for r in rollouts], step - 1)
            items, generated = best_over_worst(rollouts, len(prompts), self.run.config.data.max_len)
            return items, None, generated
        generated = {}
        steps_per_iteration = train.steps // self.settings.iterations
        if step == self.run.first_step or (step - 1) % steps_per_iteration == 0:
            k = (step - 1) // steps_per_iteration + 1
            examples, refs, generated = self.iteration_data(k, step)
            self.step_sets, self.train_refs = [examples], [refs] if refs else None
            self.sampler = MixedSampler([len(examples)], [1.0], train.seed + k)
            if self.run.state and step == self.run.first_step and (step - 1) % steps_per_iteration:  # resumed inside k
                self.sampler.load_state_dict(self.run.state["sampler"])
        items, refs, _ = super().batch(step)
        return items, refs, generated

    def iteration_data(self, k: int, step: int) -> tuple[list, list[torch.Tensor] | None, dict]:
        """RFT and SPIN: iteration k's training set, sampled from the policy as it is at the iteration's start, with
        its reference logprobs (SPIN) and statistics. Kept in the run folder, so a resumed run trains on it again."""
        saved = self.run.run_dir / f"iteration-{k}.pt"
        if saved.is_file():
            return torch.load(saved, weights_only=False)
        self.policy_at(step - 1)
        train, rollout, max_len = self.train, self.run.config.rollout, self.run.config.data.max_len
        prompts, seed_base = [p for s in self.train_sets for p in s], round_seed(train.seed, k)
        if self.algorithm.self_play == "passing":
            rollouts = self.sample(prompts, rollout.n_samples, rollout.temperature, seed_base, step)
            kept = {
                (r.group, tuple(r.response_ids)): r for r in rollouts if r.reward >= self.settings.threshold
            }  # distinct
            stats = {"rft_kept": float(len(kept)), "rft_reward_mean": sum(r.reward for r in rollouts) / len(rollouts)}
            if not kept:
                raise OxrlError(
                    f"RFT iteration {k}: none of {len(rollouts)} samples scored at least train.rft.threshold="
                    f"{self.settings.threshold} (best: {max(r.reward for r in rollouts)}); lower the threshold, "
                    f"sample more (rollout.n_samples) or start from a stronger model"
                )
            data = ([sequence(r, max_len) for r in kept.values()], None, stats)
        else:  # against the demonstrations: the reference is the policy at this point
            rollouts = self.run.pool.generate(
                [d.prompt_ids for d in prompts], 1, rollout.temperature, seed_base, [d.chosen.media for d in prompts]
            )
            pairs = [PairExample(d.chosen, sequence(r, max_len)) for d, r in zip(prompts, rollouts)]
            data = (pairs, self.precompute_reference(pairs), {})
        torch.save(data, saved)
        return data

    def evaluate(self, step: int) -> dict:
        """The policy's greedy answers to the held-out prompts, scored."""
        self.run.position.phase = "eval"
        self.policy_at(step)
        rollouts = self.sample(self.val_set, 1, 0.0, 0, step)
        return {"eval_reward_mean": sum(r.reward for r in rollouts) / len(rollouts)}

    def policy_at(self, step: int) -> None:
        """Bring the engines to the weights after `step` steps, unless they hold them."""
        if self.refreshed_at != step:
            self.run.pool.refresh(policy_version=step)
            self.refreshed_at = step

    def sample(
        self, prompts: list[PromptExample], n: int, temperature: float, seed_base: int, step: int
    ) -> list[Rollout]:
        """`n` scored samples per prompt."""
        self.run.position.phase, self.run.position.policy_version = "sample", self.refreshed_at
        rollouts = self.run.pool.generate(
            [p.prompt_ids for p in prompts], n, temperature, seed_base, [p.media for p in prompts]
        )
        self.run.score(rollouts, [p.record for p in prompts], step)
        return rollouts


def sequence(rollout: Rollout, max_len: int, trained: bool = True) -> SFTExample:
    """A sampled response after its prompt, cut to `max_len`; the mask marks the response (nothing if not `trained`)."""
    mask = [0] * len(rollout.prompt_ids) + [int(trained)] * len(rollout.response_ids)
    return SFTExample((rollout.prompt_ids + rollout.response_ids)[:max_len], mask[:max_len], rollout.media)


def best_over_worst(rollouts: list[Rollout], num_prompts: int, max_len: int) -> tuple[list[PairExample], dict]:
    """Online DPO's pairs: per prompt, its best-rewarded sample over its worst. When all of a prompt's samples score
    the same there is no preference: its pair stays in the batch fully masked, so it counts for nothing."""
    pairs, ties = [], 0
    for g in range(num_prompts):
        samples = [r for r in rollouts if r.group == g]
        best, worst = max(samples, key=lambda r: r.reward), min(samples, key=lambda r: r.reward)
        tie = best.reward == worst.reward
        ties += tie
        pairs.append(PairExample(sequence(best, max_len, trained=not tie), sequence(worst, max_len, trained=not tie)))
    return pairs, {
        "reward_mean": sum(r.reward for r in rollouts) / len(rollouts),
        "tied_prompts_frac": ties / num_prompts,
    }
