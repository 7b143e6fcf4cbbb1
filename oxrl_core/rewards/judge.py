"""An LLM judge as the reward (RLAIF: Bai et al. 2022, arXiv 2212.08073; Lee et al. 2023, arXiv 2309.00267).

Another language model reads each response and scores it; its text is parsed into the reward:

- `number`: the judge ends with `Score: N` (the last such line counts; a reply that is nothing but a number counts
  too), N in [score_min, score_max], and the reward is (N - score_min) / (score_max - score_min).
- `pairwise`: the judge sees the response and the record's reference answer as answers A and B and names the
  better one; it is asked twice with the order swapped, and the reward is the share of verdicts the response won.
  A judge that always picks the first answer (position bias) then gives every response 0.5: no signal, no harm.
- `yes-probability`: nothing is generated; the reward is the judge's probability of answering "Yes" rather than
  "No" to the prompt, p(Yes) / (p(Yes) + p(No)), each the exact probability of the word's tokens.

A judgment that cannot be read, or a judge prompt longer than the judge's context, scores `reward.on_error` and is
reported like any reward error. The judge's engine is a vLLM engine of its own in the run's Ray cluster, started
once with the run (`start`), never refreshed; each group's judgments go to it in one batch, as the group's last
sample ends. If it dies, scoring raises `RewardUnavailable`: the loop then stops with a checkpoint to resume from.
"""

import json
import math
import re
import time
from pathlib import Path

from oxrl_core.config.sections import JudgeSection
from oxrl_core.data.records import prompt_messages
from oxrl_core.data.sft import chat_template_ids
from oxrl_core.errors import OxrlError
from oxrl_core.models.hub import resolve_model
from oxrl_core.models.tokenizer import load_tokenizer
from oxrl_core.rewards.base import RewardUnavailable, Unscored
from oxrl_core.rollout.engine import RolloutEngine, start_error

TEMPLATES = {
    "number": (
        "Rate how well the response answers the question, from {score_min:g} (wrong or useless) to "
        "{score_max:g} (correct and helpful).\n\nQuestion:\n{prompt}\n\nResponse:\n{response}\n\n"
        "Explain briefly, then end with a line `Score: N`."
    ),
    "pairwise": (
        "Which answer to the question is better?\n\nQuestion:\n{prompt}\n\nAnswer A:\n{first}\n\n"
        "Answer B:\n{second}\n\nExplain briefly, then end with a line `Verdict: A` or `Verdict: B`."
    ),
    "yes-probability": (
        "Question:\n{prompt}\n\nResponse:\n{response}\n\nIs the response a correct and helpful "
        "answer to the question? Answer Yes or No."
    ),
}
PLACEHOLDERS = {
    "number": {"prompt", "response", "reference"},
    "pairwise": {"prompt", "first", "second"},
    "yes-probability": {"prompt", "response", "reference"},
}
REQUIRED = {"number": {"response"}, "pairwise": {"first", "second"}, "yes-probability": {"response"}}
YES_NO = ("Yes", "No")  # the answers whose probabilities `yes-probability` compares
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_SCORE = re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_LONE_NUMBER = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*\.?\s*")
_VERDICT = re.compile(r"verdict\s*[:=]\s*\**\s*\[*\(?\s*([AB])\b", re.IGNORECASE)
_LONE_LETTER = re.compile(r"\s*\[*\(?([AB])\)?\]*\s*\.?\s*")


def check_judge(settings: JudgeSection) -> str:
    """The judge's settings made whole (OxrlError otherwise); returns its template."""
    if settings.model is None:
        raise OxrlError("reward.judge.model: reward.func=judge needs the judge model (a folder, a Hub id or oxrl-tiny)")
    if settings.score_min >= settings.score_max:
        raise OxrlError(
            f"reward.judge.score_min={settings.score_min:g}: must be below reward.judge.score_max ({settings.score_max:g})"
        )
    if settings.template is None:
        return (
            TEMPLATES[settings.score]
            .replace("{score_min:g}", f"{settings.score_min:g}")
            .replace("{score_max:g}", f"{settings.score_max:g}")
        )
    used = set(_PLACEHOLDER.findall(settings.template))
    allowed, required = PLACEHOLDERS[settings.score], REQUIRED[settings.score]
    if used - allowed:
        raise OxrlError(
            f"reward.judge.template: unknown placeholder(s) {', '.join('{' + u + '}' for u in sorted(used - allowed))} "
            f"for score={settings.score}; allowed: {', '.join('{' + a + '}' for a in sorted(allowed))}"
        )
    if required - used:
        raise OxrlError(
            f"reward.judge.template: must contain {' and '.join('{' + r + '}' for r in sorted(required))} "
            f"(score={settings.score})"
        )
    return settings.template


def render(template: str, values: dict[str, str]) -> str:
    """`template` with each {name} of `values` replaced by its value; any other braces stay as they are."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)] if m.group(1) in values else m.group(0), template)


def parse_score(text: str, low: float, high: float) -> float | None:
    """The reward in 0..1 that a judgment gives, or None: the last `Score: N` (or a reply that is only a number),
    N within [low, high]. Several bare numbers, a refusal, or N out of range cannot be read."""
    found = _SCORE.findall(text)
    lone = _LONE_NUMBER.fullmatch(text)
    if not found and lone is None:
        return None
    value = float(found[-1] if found else lone.group(1))
    return (value - low) / (high - low) if low <= value <= high else None


def parse_verdict(text: str) -> str | None:
    """ "A" or "B" from a pairwise judgment (the last `Verdict: X`, or a reply that is only the letter), or None."""
    found = _VERDICT.findall(text)
    if found:
        return found[-1].upper()
    lone = _LONE_LETTER.fullmatch(text)
    return lone.group(1) if lone else None


def pairwise_reward(verdict_first: str | None, verdict_second: str | None) -> float | None:
    """The response's share of wins: asked as answer A (`verdict_first`), then as answer B (`verdict_second`), against
    the reference. A verdict that cannot be read counts out; with neither, None."""
    wins = [v == "A" for v in (verdict_first,) if v] + [v == "B" for v in (verdict_second,) if v]
    return sum(wins) / len(wins) if wins else None


def prompt_text(record: dict) -> str:
    """An RL record's prompt as the judge reads it: a single user turn as it is, a conversation as `role: content`
    lines."""
    messages = prompt_messages(record)
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


class Judge:
    """The reward for `reward.func: judge`: `score_batch(responses, samples)` judges a batch of responses (a group's) at
    once on the judge's engine, which `start` launches once the run's Ray cluster is up."""

    def __init__(self, settings: JudgeSection):
        self.settings, self.template = settings, check_judge(settings)
        self.model_path = resolve_model(settings.model, key="reward.judge.model")
        self.tokenizer, _ = load_tokenizer(self.model_path)
        self.engine, self.watch, self.log_path, self.calls = None, None, None, 0
        self.judgments, self._log_budget = None, 0  # judgments.jsonl, and the bytes it may still take
        self.engine_seconds = 0.0  # the engine's time in the last `score_batch`

    def start(self, reservation, run_dir: Path, samples_per_step: int) -> None:
        """The judge's vLLM engine, on the placement's judge bundle; judgments.jsonl opened in `run_dir`."""
        import ray

        s = self.settings
        sequences = samples_per_step * (2 if s.score == "pairwise" else 1)
        self.log_path = run_dir / "logs" / "judge.log"
        self.watch = reservation.watch
        self.engine = self.watch.add(
            ray.remote(RolloutEngine)
            .options(**reservation.judge_options())
            .remote(
                self.model_path,
                "bfloat16" if reservation.placement.on_gpu else "float32",
                s.max_model_len,
                s.gpu_memory_utilization,
                0,
                sequences,
                self.log_path,
            ),
            "judge",
            self.log_path,
        )
        failure = self.watch.get([self.engine.start_failure.remote()], "judge start")[0]
        if failure:
            raise start_error(failure, self.log_path)
        self._log_budget = int(s.log_max_mb * 2**20)
        self.judgments = open(run_dir / "judgments.jsonl", "a") if self._log_budget else None

    def score_batch(self, responses: list[str], samples: list[dict]) -> list[float | Unscored]:
        """Each response's reward, or why it has none (`Unscored`)."""
        s = self.settings
        if s.score in ("number", "yes-probability"):
            prompts = [
                render(
                    self.template,
                    {"prompt": prompt_text(sample), "response": response, "reference": str(sample.get("answer", ""))},
                )
                for response, sample in zip(responses, samples, strict=True)
            ]
            if s.score == "yes-probability":
                return [
                    self._log(prompt, text, reward)
                    for prompt, (text, reward) in zip(prompts, self._yes_probabilities(prompts))
                ]
            return [
                self._log(prompt, text, parse_score(text, s.score_min, s.score_max))
                for prompt, text in self._judge(prompts)
            ]
        if any("answer" not in sample for sample in samples):
            raise OxrlError(
                "reward.judge.score=pairwise: every prompt record needs an `answer` (the reference the "
                "response is compared with)"
            )
        prompts = []
        for response, sample in zip(responses, samples, strict=True):
            question, reference = prompt_text(sample), str(sample["answer"])
            prompts += [
                render(self.template, {"prompt": question, "first": response, "second": reference}),
                render(self.template, {"prompt": question, "first": reference, "second": response}),
            ]
        judgments = self._judge(prompts)
        rewards = []
        for (prompt, first), (_, second) in zip(judgments[::2], judgments[1::2]):
            reward = pairwise_reward(parse_verdict(first), parse_verdict(second))
            rewards.append(self._log(prompt, first + "\n--- swapped ---\n" + second, reward, f"{first} / {second}"))
        return rewards

    def _judge(self, prompts: list[str]) -> list[tuple[str, str]]:
        """(prompt, the judge's text) for each prompt, in one batch on the engine; a prompt too long for the judge's
        context is not sent, and its text says so (it reads as no verdict)."""
        s = self.settings
        ids, fits, texts = self._prompt_ids(prompts, s.max_tokens)
        seeds = [self.calls * 100_003 + i for i in fits]  # matter only when the judge samples (temperature > 0)
        rollouts = self._call(
            "generate", [ids[i] for i in fits], 1, s.temperature, 1.0, [s.max_tokens] * len(fits), seeds
        )
        for i, rollout in zip(fits, sorted(rollouts, key=lambda r: r.group)):
            texts[i] = self.tokenizer.decode(rollout.response_ids, skip_special_tokens=True)
        return list(zip(prompts, texts))

    def _yes_probabilities(self, prompts: list[str]) -> list[tuple[str, float | None]]:
        """(what the log shows, p(Yes) / (p(Yes) + p(No)) or None) for each prompt, in one batch on the engine."""
        answers = [self.tokenizer(word, add_special_tokens=False)["input_ids"] for word in YES_NO]
        ids, fits, shown = self._prompt_ids(prompts, max(map(len, answers)))
        rewards: list[float | None] = [None] * len(prompts)
        for i, (yes, no) in zip(fits, self._call("continuation_logprobs", [ids[i] for i in fits], answers)):
            rewards[i] = 1 / (1 + math.exp(no - yes))
            shown[i] = f"log p(Yes) = {yes:.4f}, log p(No) = {no:.4f}"
        return list(zip(shown, rewards))

    def _prompt_ids(self, prompts: list[str], new_tokens: int) -> tuple[list[list[int]], list[int], list[str]]:
        """The prompts' token ids (as the judge's chat template makes a user turn of them), the indices of those that
        fit the judge's context with `new_tokens` more, and for each one that does not, why (else "")."""
        s = self.settings
        ids = [
            chat_template_ids(self.tokenizer, [{"role": "user", "content": p}], add_generation_prompt=True)
            if self.tokenizer.chat_template
            else self.tokenizer(p)["input_ids"]
            for p in prompts
        ]
        why = [
            ""
            if len(x) + new_tokens <= s.max_model_len
            else f"(not judged: the judge prompt has {len(x)} tokens; with {new_tokens} more it exceeds "
            f"reward.judge.max_model_len={s.max_model_len})"
            for x in ids
        ]
        return ids, [i for i, text in enumerate(why) if not text], why

    def _call(self, method: str, prompt_ids: list[list[int]], *args):
        """`method` of the judge's engine on `prompt_ids` (nothing to do for none), timed; an engine that died is
        `RewardUnavailable` (one that hangs, `Hang`)."""
        import ray

        self.calls += 1
        start = time.perf_counter()
        try:
            result = (
                self.watch.get(
                    [getattr(self.engine, method).remote(prompt_ids, *args)], f"judge {method}", len(prompt_ids)
                )[0]
                if prompt_ids
                else []
            )
        except ray.exceptions.RayActorError:
            raise RewardUnavailable(
                f"reward.func=judge: the judge's vLLM engine died (its log: {self.log_path})"
            ) from None
        self.engine_seconds = time.perf_counter() - start
        return result

    def _log(self, prompt: str, text: str, reward: float | None, shown: str | None = None) -> float | Unscored:
        """`text` goes to judgments.jsonl; `shown` (default `text`) names an unread verdict in the reward error."""
        if self.judgments is not None:
            line = json.dumps({"call": self.calls, "judge_prompt": prompt, "judgment": text, "reward": reward}) + "\n"
            if len(line) > self._log_budget:
                self.judgments.write(
                    json.dumps({"note": "reward.judge.log_max_mb reached: later judgments are not written"}) + "\n"
                )
                self.judgments.close()
                self.judgments = None
            else:
                self._log_budget -= len(line)
                self.judgments.write(line)
                self.judgments.flush()
        return (
            reward
            if reward is not None
            else Unscored(f"the judge's verdict could not be read: {(shown or text)[-300:]!r}")
        )
