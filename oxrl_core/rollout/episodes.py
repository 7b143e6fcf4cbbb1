"""Rollouts as episodes against an environment (`envs/`), turn by turn.

Every live episode of a step takes its next turn in one generate call (vLLM reuses each episode's cached prefix);
between turns the environment answers each one here, and its messages, rendered by the chat template, are appended
to the episode's tokens. An episode is one `Rollout` whose response is everything after the prompt: the policy's
tokens (policy_mask 1: trained, and in the logprob gap) and, between its messages, the environment's and the
template's (policy_mask 0: never trained).

An episode ends when the environment says it is done; after `max_turns` policy messages; when a policy message is
cut by rollout.max_tokens; or when the environment's answer would not leave room for another token within
`max_episode_tokens` (every token after the prompt). The last two end it truncated (finish reason "length", so
rollout.mask_truncated applies); an episode cut by max_turns has finish reason "stop" and no reward from the
environment.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from oxrl_core.data.records import PromptExample
from oxrl_core.envs.base import Environment
from oxrl_core.errors import OxrlError
from oxrl_core.rollout.engine import Rollout

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
        self.closing = self.base_text[self.base_text.index(_MARK) + len(_MARK):]

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def reply_ids(self, messages: list[dict], last_sampled: int) -> list[int]:
        """The tokens after a policy message whose last token is `last_sampled`: the rest of the template's closing
        (less that token where the policy sampled it, e.g. <|im_end|>), `messages`, and the next generation prompt."""
        full = self._render(self.base + messages, add_generation_prompt=True)
        if not full.startswith(self.base_text):
            raise OxrlError("the chat template renders an assistant message differently once other messages follow it; "
                            "multi-turn rollouts need a template that appends turns (e.g. Qwen2.5's, ChatML)")
        closing, sampled = self.closing, self.tokenizer.decode([last_sampled])
        if sampled and closing.startswith(sampled):
            closing = closing[len(sampled):]
        return self.tokenizer(closing + full[len(self.base_text):], add_special_tokens=False)["input_ids"]


@dataclass
class _Episode:
    group: int
    env: Environment
    response_ids: list[int] = field(default_factory=list)
    policy_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_version: int | None = None
    finish_reason: str = "stop"
    reward: float | None = None


def run_episodes(generate: Callable[..., list[Rollout]], prompts: list[PromptExample], n: int, temperature: float,
                 seed_base: int, new_env: Callable[[], Environment], template: TurnTemplate, max_turns: int,
                 max_tokens: int, max_episode_tokens: int) -> list[Rollout]:
    """`n` episodes of each prompt, sorted by prompt (`Rollout.group`). `generate(contexts, n, temperature,
    seed_base, images, max_tokens)` is the pool's; `new_env()` builds an episode's environment."""
    episodes = [_Episode(group, new_env()) for group in range(len(prompts)) for _ in range(n)]
    for episode in episodes:
        episode.env.reset(prompts[episode.group].record)
    live = episodes
    for turn in range(max_turns):
        contexts = [prompts[e.group].prompt_ids + e.response_ids for e in live]
        budgets = [min(max_tokens, max_episode_tokens - len(e.response_ids)) for e in live]
        sampled = generate(contexts, 1, temperature, seed_base * MAX_TURNS + turn,
                           [prompts[e.group].images for e in live], budgets)
        still_live = []
        for episode, out in zip(live, sampled):
            episode.response_ids += out.response_ids
            episode.policy_mask += [1] * len(out.response_ids)
            episode.logprobs += out.sampler_logprobs
            # the oldest weights any of its turns were sampled with: the loop's policy-version check sees a stale turn
            episode.policy_version = out.policy_version if episode.policy_version is None else \
                min(episode.policy_version, out.policy_version)
            if out.finish_reason == "length":
                episode.finish_reason = "length"
                continue
            answer = episode.env.step(template.tokenizer.decode(out.response_ids, skip_special_tokens=True))
            if answer.done:
                episode.reward = answer.reward
                continue
            if turn == max_turns - 1:
                continue
            reply = template.reply_ids(answer.messages, out.response_ids[-1])
            if len(episode.response_ids) + len(reply) >= max_episode_tokens:
                episode.finish_reason = "length"
                continue
            episode.response_ids += reply
            episode.policy_mask += [0] * len(reply)
            episode.logprobs += [0.0] * len(reply)
            still_live.append(episode)
        live = still_live
        if not live:
            break
    return [Rollout(e.group, prompts[e.group].prompt_ids, e.response_ids, e.logprobs, e.finish_reason, e.policy_version,
                    images=prompts[e.group].images, policy_mask=e.policy_mask, env_reward=e.reward) for e in episodes]
