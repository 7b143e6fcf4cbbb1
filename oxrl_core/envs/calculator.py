"""A calculator the policy may call while it solves an arithmetic problem: `add`, `sub`, `mul`, `div`.

The episode ends at the first assistant message without a tool call: that message is the answer, which
`reward.func` (e.g. `math`) scores against the record's.
"""

from oxrl_core.envs.base import EnvStep, question
from oxrl_core.envs.tool_calls import parse_tool_calls, run_tool_calls

LIMIT = 1e12  # operands and results beyond it are refused: no tool call may cost more than a multiplication


def _number(x: object) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not abs(x) <= LIMIT:  # also refuses NaN
        raise ValueError(f"operands are numbers within ±{LIMIT:g}, got {str(x)[:20]}")
    return x


def _result(x: float) -> str:
    if not abs(x) <= LIMIT:
        raise ValueError(f"the result is beyond ±{LIMIT:g}")
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def _spec(name: str, what: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": what,
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }


class Calculator:
    FUNCTIONS = {
        "add": lambda a, b: _result(_number(a) + _number(b)),
        "sub": lambda a, b: _result(_number(a) - _number(b)),
        "mul": lambda a, b: _result(_number(a) * _number(b)),
        "div": lambda a, b: _result(_number(a) / _number(b)),  # ZeroDivisionError is the model's to read
    }
    tools = [_spec("add", "a + b"), _spec("sub", "a - b"), _spec("mul", "a * b"), _spec("div", "a / b")]

    def reset(self, record: dict) -> list[dict]:
        return question(record)

    def step(self, assistant_text: str) -> EnvStep:
        calls = parse_tool_calls(assistant_text)
        if not calls:
            return EnvStep(done=True)
        return EnvStep(run_tool_calls(calls, self.FUNCTIONS))
