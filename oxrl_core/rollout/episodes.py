"""Rollouts as episodes against an environment (`envs/`), turn by turn.

Each episode goes at its own pace: the moment a policy message ends, the environment answers it and the episode's
next turn goes to the same engine (vLLM reuses its cached prefix), whatever the other episodes are doing; no turn
waits for the slowest episode (`stream.py`). An episode is one `Rollout` whose response is everything after the
prompt: the policy's tokens (policy_mask 1: trained, and in the logprob gap) and, between its messages, the
environment's and the template's (policy_mask 0: never trained).

An episode ends when the environment says it is done; after `max_turns` policy messages; when a policy message is
cut by rollout.max_tokens; or when the environment's answer would not leave room for another token within
`max_episode_tokens` (every token after the prompt). The last two end it truncated (finish reason "length", so
rollout.mask_truncated applies); an episode cut by max_turns has finish reason "stop" and no reward from the
environment.
"""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from oxrl_core.data.records import PromptExample
from oxrl_core.envs.base import Environment
from oxrl_core.errors import OxrlError
from oxrl_core.rollout.records import Completion, Rollout, SampleRequest, sample_seed

MAX_TURNS = 16  # a turn's seeds are spaced within a step's by this
_MARK = "\x00ASSISTANT\x00"


class TurnTemplate:
    """How the chat template joins a conversation's turns, read from the tokenizer: what follows an assistant
    message's content (ChatML: "<|im_end|>\\n") and how environment messages render after it, up to the next
    generation prompt. Rendered after a fixed one-exchange conversation, so that a template that renders earlier
    turns differently as the conversation grows cannot shift the tokens already sampled."""

    def __init__(self, tokenizer, tools: list[dict]):
        self.tokenizer, self.tools = tokenizer, tools or None
        self.base = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK}]
        self.base_text = self._render(self.base, add_generation_prompt=False)
        self.closing = self.base_text[self.base_text.index(_MARK) + len(_MARK) :]

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def reply_ids(self, messages: list[dict], last_sampled: int) -> list[int]:
        """The tokens after a policy message whose last token is `last_sampled`: the rest of the template's closing
        (less that token where the policy sampled it, e.g. <|im_end|>), `messages`, and the next generation prompt."""
        full = self._render(self.base + messages, add_generation_prompt=True)
        if not full.startswith(self.base_text):
            raise OxrlError(
                "the chat template renders an assistant message differently once other messages follow it; "
                "multi-turn rollouts need a template that appends turns (e.g. Qwen2.5's, ChatML)"
            )
        closing, sampled = self.closing, self.tokenizer.decode([last_sampled])
        if sampled and closing.startswith(sampled):
            closing = closing[len(sampled) :]
        return self.tokenizer(closing + full[len(self.base_text) :], add_special_tokens=False)["input_ids"]


@dataclass
class _Episode:
    group: int
    env: Environment
    response_ids: list[int] = field(default_factory=list)
    policy_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version_starts: list[tuple[int, int]] = field(default_factory=list)  # as Rollout's, over all its turns
    finish_reason: str = "stop"
    reward: float | None = None
    turns: int = 0
    # a mixture of experts': its last turn's routes, which cover every turn before it as that turn's prompt (the
    # prefix cache serves earlier turns' blocks as they were routed then, rollout/routes.py)
    routes: np.ndarray | None = None


def stream_episodes(
    stream: Callable[..., Iterable[Completion]],
    prompts: list[PromptExample],
    n: int,
    temperature: float,
    top_p: float,
    seed_base: int,
    new_env: Callable[[], Environment],
    template: TurnTemplate,
    max_turns: int,
    max_tokens: int,
    max_episode_tokens: int,
) -> Iterator[tuple[int, Rollout]]:
    """`n` episodes of each prompt (`Rollout.group`: its prompt's index), each yielded when it ends with its number
    (prompt i's j-th episode is i * n + j). `stream(requests,
    groups, follow_up)` is the pool's; `new_env()` builds an episode's environment. Episode k's turn t is seeded by
    both, so a rerun samples alike."""
    episodes = [_Episode(group, new_env()) for group in range(len(prompts)) for _ in range(n)]
    for episode in episodes:
        episode.env.reset(prompts[episode.group].record)

    def turn(k: int) -> SampleRequest:
        e = episodes[k]
        return SampleRequest(
            k,
            prompts[e.group].prompt_ids + e.response_ids,
            min(max_tokens, max_episode_tokens - len(e.response_ids)),
            sample_seed(seed_base * MAX_TURNS + e.turns, k, 1, 0),
            temperature,
            top_p,
            prompts[e.group].media,
        )

    def follow_up(done: Completion) -> list[SampleRequest]:
        """The episode's message is in: record it, let the environment answer; its next turn, if any."""
        e = episodes[done.key]
        for version, first in done.version_starts:  # where the weights changed, between turns or within one
            if not e.version_starts or e.version_starts[-1][0] != version:
                e.version_starts.append((version, len(e.response_ids) + first))
        e.response_ids += done.token_ids
        e.policy_mask += [1] * len(done.token_ids)
        e.logprobs += done.logprobs
        e.routes = done.routes
        e.turns += 1
        if done.finish_reason == "length":
            e.finish_reason = "length"
            return []
        answer = e.env.step(template.tokenizer.decode(done.token_ids, skip_special_tokens=True))
        if answer.done:
            e.reward = answer.reward
            return []
        if e.turns == max_turns:
            return []
        reply = template.reply_ids(answer.messages, done.token_ids[-1])
        if len(e.response_ids) + len(reply) >= max_episode_tokens:
            e.finish_reason = "length"
            return []
        e.response_ids += reply
        e.policy_mask += [0] * len(reply)
        e.logprobs += [0.0] * len(reply)
        return [turn(done.key)]

    for done in stream([turn(k) for k in range(len(episodes))], [e.group for e in episodes], follow_up):
        e = episodes[done.key]
        # the oldest weights any of its turns were sampled with: the loop's policy-version check sees a stale turn
        oldest = min(version for version, _ in e.version_starts)
        yield (
            done.key,
            Rollout(
                e.group,
                prompts[e.group].prompt_ids,
                e.response_ids,
                e.logprobs,
                e.finish_reason,
                oldest,
                media=prompts[e.group].media,
                policy_mask=e.policy_mask,
                env_reward=e.reward,
                version_starts=tuple(e.version_starts) if len(e.version_starts) > 1 else (),
                routes=e.routes,
            ),
        )
