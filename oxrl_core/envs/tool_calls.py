"""Tool calls in the model's text, by Qwen's chat-template convention (Hermes style):

    <tool_call>
    {"name": "add", "arguments": {"a": 2, "b": 3}}
    </tool_call>

A call that cannot be read is not a crash: it becomes an observation the model sees on its next turn (an error
message in the tool's reply), as a user's bad command would in a shell. Limits keep a hostile text (huge, deeply
nested, hundreds of calls) from costing the rollout more than reading it.
"""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_CALLS = 8  # per assistant message; more is answered with an error, none of them run
MAX_CALL_CHARS = 2_000  # one call's JSON
MAX_RESULT_CHARS = 500  # a tool's reply, as the model sees it

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class BadCall:
    """A call that could not be read or run: why, in words the model can act on."""

    error: str


def parse_tool_calls(text: str) -> list[ToolCall | BadCall]:
    """Every `<tool_call>…</tool_call>` of an assistant message, in order; an opened call never closed counts as
    one bad call. No call: []."""
    bodies = _CALL.findall(text)
    unclosed = text.count("<tool_call>") > len(bodies)
    if len(bodies) + unclosed > MAX_CALLS:
        return [BadCall(f"{len(bodies) + unclosed} tool calls in one message; at most {MAX_CALLS}")]
    calls = [_parse_one(body) for body in bodies]
    if unclosed:
        calls.append(BadCall("a <tool_call> without its </tool_call>"))
    return calls


def _parse_one(body: str) -> ToolCall | BadCall:
    body = body.strip()
    if len(body) > MAX_CALL_CHARS:
        return BadCall(f"a tool call of {len(body)} characters; at most {MAX_CALL_CHARS}")
    try:
        call = json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: nesting deep enough to exhaust the parser
        return BadCall(f"not JSON: {str(e)[:100]}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return BadCall('expected {"name": <tool name>, "arguments": {...}}')
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return BadCall(f"{call['name']}: arguments must be an object, got {type(arguments).__name__}")
    return ToolCall(call["name"], arguments)


def run_tool_calls(calls: list[ToolCall | BadCall], tools: dict[str, Callable[..., object]]) -> list[dict]:
    """Each call's reply as a `tool` message: the function's result, or the error (an unknown tool, bad arguments,
    the function's own exception) as text for the model to read."""
    replies = []
    for call in calls:
        if isinstance(call, BadCall):
            content = f"error: {call.error}"
        elif call.name not in tools:
            content = f"error: unknown tool {call.name[:50]!r}; tools: {', '.join(tools)}"
        else:
            try:
                content = str(tools[call.name](**call.arguments))
            except Exception as e:  # the tool's failure is the model's to read, never the run's
                content = f"error: {call.name}: {type(e).__name__}: {e}"
        replies.append({"role": "tool", "content": content[:MAX_RESULT_CHARS]})
    return replies
