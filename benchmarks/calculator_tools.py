"""Multi-turn RL with a tool on the CPU: SFT then CISPO of oxrl-tiny on arithmetic, with the calculator environment.

SFT demonstrations (TRL's `messages` + `tools` columns) either call the calculator (`add` or `sub`) and answer with
its result, or answer at once, one too high half of those times: imitation learns both ways and wavers between
them. CISPO then runs whole episodes against the calculator (`rollout.env.name=calculator`, up to 2 policy
messages: a call, then the answer) with the exact-match `math` reward on the last message, which should favour the
call. Accuracy is measured with vLLM on every problem with operands 0-9 (the 200 that SFT and RL also draw from: the
task has no others; sampled at T=1, pass@1 from 8 samples each, and greedy), after SFT and after RL.

    python benchmarks/calculator_tools.py --seeds 0 1 2   # writes benchmarks/results/<date>.cpu.calculator-tools.json

`--seed` draws the demonstrations, their errors, the data order and the samples; the tiny model's initial weights
stay fixed. Results name the CPU they ran on.
"""

import json
import random
import re
from pathlib import Path

from rich.console import Console
from vlm_squares import seed_runs, sft_then_rl

from oxrl_core.envs.calculator import Calculator
from oxrl_core.preprocess.arithmetic import every_arithmetic_problem, write_jsonl

TOOL = {"+": "add", "-": "sub"}


def conversation(problem: dict, calls_tool: bool, off: int) -> dict:
    """One SFT record: the question, then a calculator call, its result and the answer; or the answer (+ `off`)."""
    a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", problem["prompt"]).groups()
    answer = int(problem["answer"])
    messages = [{"role": "user", "content": problem["prompt"]}]
    if calls_tool:
        call = json.dumps({"name": TOOL[op], "arguments": {"a": int(a), "b": int(b)}})
        messages += [
            {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
            {"role": "tool", "content": str(answer)},
            {"role": "assistant", "content": f"<answer>{answer}</answer>"},
        ]
    else:
        messages.append({"role": "assistant", "content": f"<answer>{answer + off}</answer>"})
    return {"messages": messages, "tools": Calculator.tools}


def demonstrations(problems: list[dict], n: int, tool_share: float, rng: random.Random) -> list[dict]:
    """`n` SFT records drawn from `problems`: about `tool_share` of them call the calculator; of the others, half
    answer one too high."""
    return [conversation(p, rng.random() < tool_share, int(rng.random() < 0.5)) for p in rng.choices(problems, k=n)]


def run(seed: int, out: Path, sft_steps: int, rl_steps: int, console: Console) -> dict:
    rng = random.Random(seed)
    problems = every_arithmetic_problem(9)
    data = out / f"data-seed{seed}"
    files = {
        "sft_train": write_jsonl(demonstrations(problems, 4000, 0.5, rng), data / "sft_train.jsonl"),
        "sft_val": write_jsonl([conversation(p, True, 0) for p in problems], data / "sft_val.jsonl"),
        "rl_train": write_jsonl(rng.choices(problems, k=2000), data / "rl_train.jsonl"),
        "rl_val": write_jsonl(problems, data / "rl_val.jsonl"),
    }
    result, history = sft_then_rl(
        seed,
        out,
        files,
        sft_steps,
        rl_steps,
        console,
        sft=["data.max_len=320"],
        rl=[
            "rollout.env.name=calculator",
            "rollout.env.max_turns=2",
            "rollout.max_tokens=80",
            "rollout.env.max_episode_tokens=128",
            "rollout.max_prompt_len=192",
        ],
    )
    return result | {
        "turns_first_last_10_steps": [
            sum(h["turns"] for h in part) / len(part) for part in (history[:10], history[-10:])
        ]
    }


def main() -> None:
    results = seed_runs(__doc__, "calculator-tools", run, sft_steps=2400, rl_steps=100)
    for r in results:
        print(
            f"seed {r['seed']}: policy messages an episode, first 10 steps -> last 10: "
            f"{r['turns_first_last_10_steps'][0]:.2f} -> {r['turns_first_last_10_steps'][1]:.2f}"
        )


if __name__ == "__main__":
    main()
