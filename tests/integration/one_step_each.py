"""One optimizer step of each named algorithm, from its shipped example, through its recipe and a real trainer rank.

Run as a script by `test_every_algorithm_steps.py`: `python one_step_each.py MODEL OUT PORT STEP...`, a STEP being
an algorithm (`dpo`: its example, `examples/dpo_tiny.yaml`, on MODEL) or `ALG:EXAMPLE:MODEL[:KEY=VALUE...]`
(`dpo:vlm_dpo_tiny:PATH`: another example and model, e.g. a multimodal family's, with settings of its own). For each
it loads the example as `oxrl train` does (`resolve_run`: defaults, the algorithm's checks), shrunk to one rank and
a small batch, builds the harness's `Run` and the recipe `oxrl train` would, and calls the recipe's `start` and
`step(1)`: the recipe reads the data, builds the micro-batches, computes reference and old logprobs and advantages,
and the rank (`TrainEngine`, one gloo process, in-process) runs the algorithm's loss, its backward and the optimizer
step. What stands in is the cluster's plumbing only: the group calls the rank directly, and the vLLM engines are a
sampler that answers each prompt right on its even samples and wrong on its odd ones (the tokens of
`<answer>...</answer>`), so every group's rewards differ.
Writes `OUT/results.json`: per STEP, its metrics, how far the trained weights moved, whether its micro-batches
carried media and, for a mixture of experts, the tokens each expert received (expert_load.jsonl).
"""

import gc
import json
import sys
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.cluster.placement import decide, local_gpus
from oxrl_core.loops.harness import Run
from oxrl_core.loops.train import recipe_for
from oxrl_core.models.tokenizer import load_tokenizer
from oxrl_core.resolve.run import ResolvedRun, resolve_run
from oxrl_core.rewards import resolve_reward
from oxrl_core.rollout.pool import RolloutPool
from oxrl_core.rollout.records import Completion, SampleRequest
from oxrl_core.training.engine import TrainEngine

# The example each algorithm starts from where it has none of its own (GSPO-token is GSPO at the token level).
EXAMPLE_OF = {"gspo-token": "gspo"}
RL_BATCH = ["train.batch_size=8", "train.micro_batch_size=4", "train.grad_accum=2", "rollout.n_samples=4"]
SL_BATCH = ["train.batch_size=4", "train.micro_batch_size=2", "train.grad_accum=2", "rollout.n_samples=2"]


class OneRank:
    """The training group's interface (`training/group.py`) over one rank in this process."""

    def __init__(self, engine: TrainEngine):
        self.engine, self.ranks, self.trained_on_media = engine, [engine], False

    def call(self, method, *per_rank_args, **common) -> list:
        if (
            method is TrainEngine.train_step
        ):  # the micro-batches carry the prompts' images or audio where the example has them
            self.trained_on_media |= any("media" in batch for batch in per_rank_args[0][0])
        return [method(self.engine, *(args[0] for args in per_rank_args), **common)]


class AnsweringSampler(RolloutPool):
    """The rollout pool's interface without vLLM: sample j of a prompt answers it right when j is even, else wrong;
    each sample carries the policy version of the last refresh, as an engine's do."""

    def __init__(self, resolved: ResolvedRun, tokenizer, answers: dict[tuple, str]):
        self.rollout, self.placement = resolved.config.rollout, decide(resolved.placement, local_gpus())
        self.tokenizer, self.answers, self.version, self.engines = tokenizer, answers, 0, [[]]

    def stream(self, requests: list[SampleRequest], groups: list[int], follow_up=None):
        for r in requests:
            answer = self.answers.get(prompt_key(r.prompt_ids, r.media), "") if r.key % 2 == 0 else "none"
            ids = self.tokenizer.encode(f"<answer>{answer}</answer>", add_special_tokens=False)[: r.max_tokens - 1]
            ids.append(self.tokenizer.eos_token_id)
            yield Completion(r.key, ids, [-1.0] * len(ids), "stop", [(self.version, 0)])

    def refresh(self, policy_version: int) -> None:
        self.version = policy_version


def prompt_key(prompt_ids: list[int], media) -> tuple:
    """A prompt's text and images: the squares task asks one question of many pictures."""
    return tuple(prompt_ids), tuple(bytes(np.asarray(m).tobytes()) for m in media or ())


def one_step(alg: str, example: Path, model_path: str, settings: list[str], out: Path, port: int) -> dict:
    algorithm = ALGORITHMS[alg]
    overrides = [
        f"train.alg={alg}",
        f"model.name_or_path={model_path}",
        "run.train_ranks=1",
        "deepspeed.zero_stage=2",
        "train.warmup_steps=0",
        f"run.output_dir={out}",
        *(RL_BATCH if algorithm.loop == "rl" else SL_BATCH),
        *settings,
    ]
    if algorithm.teacher:
        overrides.append(f"train.kd.teacher={model_path}")
    resolved = resolve_run(algorithm.loop, example, overrides)
    config, path = resolved.config, resolved.model_path
    tokenizer, pad_id = load_tokenizer(path)
    reward_fn = resolve_reward(config.reward.func, config.reward.kwargs) if algorithm.rewards else None
    run_dir = out / f"{Path(model_path).name}-{example.stem}-{alg}"
    run_dir.mkdir(parents=True)
    run = Run(config, path, algorithm, Console(stderr=True), run_dir, {}, tokenizer, pad_id, reward_fn, None)
    recipe = recipe_for(algorithm)(run)
    data = getattr(recipe, "prompt_sets", None) or recipe.train_sets
    answers = {
        prompt_key(p.prompt_ids, p.media): str(p.record.get("answer", ""))
        for s in data
        for p in s
        if hasattr(p, "record")
    }
    engine = TrainEngine(resolved.trainer, path, 0, 1, ("127.0.0.1", port), run_dir / "logs")
    group = run.group = OneRank(engine)
    run.pool = AnsweringSampler(resolved, tokenizer, answers) if algorithm.generates else None
    trained = [p for p in engine.engine.module.parameters() if p.requires_grad]
    before = torch.cat([p.detach().flatten() for p in trained]).clone()
    recipe.start()
    metrics = recipe.step(1)
    moved = float((torch.cat([p.detach().flatten() for p in trained]) - before).abs().max())
    result = {"metrics": metrics, "weights_moved": moved, "trained_on_media": group.trained_on_media}
    if (run_dir / "expert_load.jsonl").is_file():  # a mixture of experts' tokens per expert
        result["expert_load"] = [json.loads(line) for line in (run_dir / "expert_load.jsonl").read_text().splitlines()]
    del engine, group, run, recipe, trained
    gc.collect()
    return result


def parse(step: str, model: str) -> tuple[str, Path, str, list[str]]:
    alg, example, other_model, *settings = step.split(":") + ["", ""]
    example_file = Path("examples") / f"{example or EXAMPLE_OF.get(alg, alg) + '_tiny'}.yaml"
    return alg, example_file, other_model or model, [s for s in settings if s]


if __name__ == "__main__":
    model, out, port, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    results = {step: one_step(*parse(step, model), out, port) for step in steps}
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float))
