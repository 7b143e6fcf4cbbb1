"""Evaluating a checkpoint: n samples per prompt from vLLM, scored by a reward, reported as pass@k.

A sample is correct when its reward is at least `correct_threshold` (1.0 by
default: the shipped verifiable rewards give 1.0 to a right answer, less
otherwise); pass@k is the unbiased estimator of `passk.py`. Each prompt has its
own sampling seed, derived from `seed` and its index, so a rerun draws the same
samples and a second checkpoint (`--compare`) is sampled on the same prompts
with the same seeds. The engine runs in this process (no Ray) and is shut down
before the next one starts.
"""

import gc
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console

from oxrl_core.data.records import DataReport, PromptExample, load_prompts, report_data
from oxrl_core.errors import OxrlError
from oxrl_core.evaluation.passk import mean_pass_at_k
from oxrl_core.models.hub import resolve_model
from oxrl_core.models.tokenizer import load_tokenizer
from oxrl_core.rewards import resolve_reward, score_samples
from oxrl_core.rollout.engine import RolloutEngine
from oxrl_core.rollout.records import Rollout

REWARD_ON_ERROR = 0.0  # a reward that raises scores this (wrong) and is reported with its sample
OUTPUT_FILES = ("samples.jsonl", "summary.json", "reward_errors.jsonl", "skipped_records.txt")


@dataclass(frozen=True)
class EvalSettings:
    n: int = 8  # samples per prompt
    ks: tuple[int, ...] = (1, 8)  # the k of each pass@k reported
    temperature: float = 1.0
    max_tokens: int = 512  # new tokens per sample
    max_prompt_len: int = 1024  # longer prompts are skipped and reported
    seed: int = 0
    correct_threshold: float = 1.0  # a sample is correct when its reward >= this
    gpu_memory_utilization: float = 0.5  # vLLM's share of GPU memory (on CPU the KV cache is sized from the model)
    strict: bool = False  # a bad record is fatal instead of skipped


@dataclass
class Candidate:
    """A model to evaluate, with the prompts as its tokenizer renders them."""

    name: str  # as given (--model, --compare)
    path: str  # the resolved folder or Hub id
    tokenizer: object
    prompts: list[PromptExample]
    report: DataReport


def check_settings(s: EvalSettings) -> None:
    """Refuse settings that cannot make a meaningful evaluation, naming the option."""
    if s.n < 1:
        raise OxrlError(f"--n {s.n}: samples per prompt must be at least 1")
    if s.temperature < 0:
        raise OxrlError(f"--temperature {s.temperature}: must be >= 0 (0 is greedy decoding)")
    if s.temperature == 0 and s.n != 1:
        raise OxrlError(
            f"--n {s.n} with --temperature 0: greedy decoding gives the same answer every time; "
            "pass --n 1 --k 1, or a temperature > 0"
        )
    if not s.ks:
        raise OxrlError("--k: give at least one k, e.g. 1,8")
    for k in s.ks:
        if not 1 <= k <= s.n:
            raise OxrlError(f"--k {k}: pass@k needs 1 <= k <= --n ({s.n}), the samples drawn per prompt")
    if s.max_tokens < 1:
        raise OxrlError(f"--max-tokens {s.max_tokens}: must be at least 1")
    if s.max_prompt_len < 1:
        raise OxrlError(f"--max-prompt-len {s.max_prompt_len}: must be at least 1")
    if not 0 < s.gpu_memory_utilization <= 1:
        raise OxrlError(f"--gpu-memory-utilization {s.gpu_memory_utilization}: must be in (0, 1]")


def run_eval(
    models: list[str],
    data: Path,
    reward: str,
    reward_kwargs: dict,
    settings: EvalSettings,
    out: Path | None,
    console: Console,
) -> list[dict]:
    """Evaluate one model, or two (model A, model B) one after the other on the same prompts and seeds.

    Every check (settings, models, data, reward) runs before the first vLLM
    engine starts. Writes samples.jsonl and summary.json (and reward_errors.jsonl,
    skipped_records.txt when there are any) into `out`, or with two models into
    `out/model_a` and `out/model_b`; returns the summaries.
    """
    check_settings(settings)
    paths = [resolve_model(m) for m in models]
    candidates = [_load(name, path, Path(data), settings) for name, path in zip(models, paths)]
    _check_same_prompts(candidates, data)
    reward_fn = resolve_reward(reward, reward_kwargs)
    if reward_fn is None:
        raise OxrlError(
            "--reward env: an environment's own score exists only for the episodes of an RL run; "
            "`oxrl eval` scores single responses (math, gsm8k, format, code, or module:function)"
        )
    out = Path(out) if out else default_out(models)
    folders = [out] if len(models) == 1 else [out / "model_a", out / "model_b"]
    summaries = []
    for candidate, folder in zip(candidates, folders):
        folder.mkdir(parents=True, exist_ok=True)
        for name in OUTPUT_FILES:  # a rerun into the same folder leaves nothing stale
            (folder / name).unlink(missing_ok=True)
        report_data([candidate.report], folder, console)
        console.print(
            f"{candidate.name}: sampling {settings.n} per prompt from {len(candidate.prompts)} prompts",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
        rollouts = generate(candidate.path, candidate.prompts, settings)
        summary = _score_and_write(candidate, rollouts, reward_fn, settings, folder)
        summaries.append(
            {
                "model": candidate.name,
                "model_path": candidate.path,
                "data": str(data),
                "reward": reward,
                "reward_kwargs": reward_kwargs,
                **summary,
                "out": str(folder),
            }
        )
        (folder / "summary.json").write_text(json.dumps(summaries[-1], indent=2, default=str) + "\n")
    return summaries


def default_out(models: list[str]) -> Path:
    """./eval/<name>, or ./eval/<name A>-vs-<name B>; a name is the last two parts of the model's path or Hub id."""

    def name(model: str) -> str:
        return "-".join([p for p in Path(model).parts if p not in ("/", ".", "..", "~")][-2:])

    return Path("eval") / "-vs-".join(name(m) for m in models)


def _load(name: str, path: str, data: Path, s: EvalSettings) -> Candidate:
    tokenizer, _ = load_tokenizer(path)
    if not tokenizer.chat_template:
        raise OxrlError(f"{name}: its tokenizer has no chat template; prompts are rendered with it")
    prompts, report = load_prompts(data, tokenizer, s.max_prompt_len, s.strict)
    return Candidate(name, path, tokenizer, prompts, report)


def _check_same_prompts(candidates: list[Candidate], data: Path) -> None:
    """Two tokenizers may render a prompt to different lengths; the comparison needs the same records kept."""
    if len(candidates) < 2:
        return
    a, b = ({p.line for p in c.report.problems} for c in candidates)
    if a != b:
        line = min(a ^ b)
        raise OxrlError(
            f"--compare: {data}:{line} is skipped for one model and kept for the other (their tokenizers "
            f"render it differently); the comparison needs the same prompts: raise --max-prompt-len or drop it"
        )


def generate(model_path: str, prompts: list[PromptExample], s: EvalSettings) -> list[Rollout]:
    """`s.n` samples of each prompt (with its media, if any; sorted by prompt) from a vLLM engine started for them and
    shut down after."""
    on_gpu = torch.cuda.is_available()
    engine = RolloutEngine(
        model_path,
        "bfloat16" if on_gpu else "float32",
        max(len(p.prompt_ids) for p in prompts) + s.max_tokens,
        s.gpu_memory_utilization,
        s.seed,
        len(prompts) * s.n,
    )
    try:
        # vLLM seeds a request's j-th sample with seed + j: spacing the prompts' seeds by n keeps every sample's
        # random stream its own, also across --seed values
        return engine.generate(
            [p.prompt_ids for p in prompts],
            s.n,
            s.temperature,
            1.0,
            [s.max_tokens] * len(prompts),
            [(s.seed * len(prompts) + i) * s.n for i in range(len(prompts))],
            [p.media for p in prompts],
        )
    finally:
        # vLLM's engine core hides its objects from the garbage collector (gc.freeze) until its shutdown; without it
        # the weights and KV cache stay, and the next engine finds no room (on CPU it sizes its KV cache by this
        # process's resident memory).
        engine.llm.llm_engine.engine_core.shutdown()
        del engine
        gc.collect()


def _score_and_write(c: Candidate, rollouts: list[Rollout], reward_fn, s: EvalSettings, folder: Path) -> dict:
    responses = [c.tokenizer.decode(r.response_ids, skip_special_tokens=True) for r in rollouts]
    rewards, errors = score_samples(
        reward_fn, responses, [c.prompts[r.group].record for r in rollouts], REWARD_ON_ERROR
    )
    with open(folder / "samples.jsonl", "w") as f:
        for r, response, reward in zip(rollouts, responses, rewards):
            f.write(
                json.dumps(
                    {
                        "prompt_index": r.group,
                        "record": c.prompts[r.group].record,
                        "response": response,
                        "reward": reward,
                        "correct": reward >= s.correct_threshold,
                        "length": len(r.response_ids),
                        "finish_reason": r.finish_reason,
                    },
                    default=str,
                )
                + "\n"
            )
    if errors:
        (folder / "reward_errors.jsonl").write_text("".join(json.dumps(e, default=str) + "\n" for e in errors))
    rewards_by_prompt = [[] for _ in c.prompts]  # [P][n]
    for r, reward in zip(rollouts, rewards):
        rewards_by_prompt[r.group].append(reward)
    metrics = sample_metrics(
        rewards_by_prompt, [len(r.response_ids) for r in rollouts], [r.finish_reason for r in rollouts], s
    )
    settings = {key: value for key, value in asdict(s).items() if key not in ("gpu_memory_utilization", "strict")}
    return {
        "settings": settings,
        "prompts": len(c.prompts),
        "skipped_records": len(c.report.problems),
        "samples": len(rollouts),
        "metrics": {**metrics, "reward_errors": len(errors)},
    }


def sample_metrics(rewards: list[list[float]], lengths: list[int], finish_reasons: list[str], s: EvalSettings) -> dict:
    """pass@k for each k, mean reward, response length in tokens, the share cut at max_tokens.
    `rewards` is [prompts][n]; `lengths` and `finish_reasons` have one entry per sample."""
    correct = [sum(reward >= s.correct_threshold for reward in group) for group in rewards]  # NaN counts as wrong
    flat = [reward for group in rewards for reward in group]
    return {
        **{f"pass@{k}": mean_pass_at_k(correct, s.n, k) for k in s.ks},
        "reward_mean": sum(flat) / len(flat),
        "response_length_mean": sum(lengths) / len(lengths),
        "response_length_median": statistics.median(lengths),
        "response_length_max": max(lengths),
        "truncated_share": finish_reasons.count("length") / len(finish_reasons),
    }
