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

import argparse
import json
import os
import random
import re
import time
from pathlib import Path

from rich.console import Console

from oxrl_core.config import load_rl_config, load_sl_config
from oxrl_core.envs.calculator import Calculator
from oxrl_core.loops.rl import train_rl
from oxrl_core.loops.sl import train_sl
from oxrl_core.preprocess.arithmetic import every_arithmetic_problem, write_jsonl
from vlm_squares import write_report

DEMO = Path(__file__).resolve().parents[1] / "oxrl_core"
TOOL = {"+": "add", "-": "sub"}


def conversation(problem: dict, calls_tool: bool, off: int) -> dict:
    """One SFT record: the question, then a calculator call, its result and the answer; or the answer (+ `off`)."""
    a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", problem["prompt"]).groups()
    answer = int(problem["answer"])
    messages = [{"role": "user", "content": problem["prompt"]}]
    if calls_tool:
        call = json.dumps({"name": TOOL[op], "arguments": {"a": int(a), "b": int(b)}})
        messages += [{"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
                     {"role": "tool", "content": str(answer)},
                     {"role": "assistant", "content": f"<answer>{answer}</answer>"}]
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
    files = {"sft_train": write_jsonl(demonstrations(problems, 4000, 0.5, rng), data / "sft_train.jsonl"),
             "sft_val": write_jsonl([conversation(p, True, 0) for p in problems], data / "sft_val.jsonl"),
             "rl_train": write_jsonl(rng.choices(problems, k=2000), data / "rl_train.jsonl"),
             "rl_val": write_jsonl(problems, data / "rl_val.jsonl")}
    start = time.perf_counter()
    common = [f"run.output_dir={out}", f"train.seed={seed}"]
    sft_config, model_path = load_sl_config(DEMO / "demo_sft.yaml", common + [
        f"data.train=[{{path: {files['sft_train']}}}]", f"data.val={files['sft_val']}", f"run.name=sft-seed{seed}",
        f"train.steps={sft_steps}", "data.max_len=320"])
    sft = train_sl(sft_config, model_path, resume=False, console=console)
    rl_config, sft_model = load_rl_config(DEMO / "demo_rl.yaml", common + [
        f"model.name_or_path={sft['checkpoint']}", f"data.train=[{{path: {files['rl_train']}}}]",
        f"data.val={files['rl_val']}", f"run.name=rl-seed{seed}", f"train.steps={rl_steps}",
        "rollout.env.name=calculator", "rollout.env.max_turns=2", "rollout.max_tokens=80",
        "rollout.env.max_episode_tokens=128", "rollout.max_prompt_len=192"])
    rl = train_rl(rl_config, sft_model, resume=False, console=console)
    history = rl["history"]
    return {"seed": seed, "sft_steps": sft_steps, "rl_steps": rl_steps, "sft_eval_loss": sft["eval_loss"],
            "after_sft": rl["eval_before"], "after_rl": rl["eval_after"],
            "turns_first_last_10_steps": [sum(h["turns"] for h in part) / len(part) for part in (history[:10], history[-10:])],
            "wall_time_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sft-steps", type=int, default=2400)
    parser.add_argument("--rl-steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OXRL_CHECKPOINT_DIR", "checkpoints")) / "calculator-tools")
    args = parser.parse_args()
    console = Console()
    results = [run(seed, args.out, args.sft_steps, args.rl_steps, console) for seed in args.seeds]
    write_report("calculator-tools", results, console)
    for r in results:
        console.print(f"seed {r['seed']}: policy messages an episode, first 10 steps -> last 10: "
                      f"{r['turns_first_last_10_steps'][0]:.2f} -> {r['turns_first_last_10_steps'][1]:.2f}")

if __name__ == "__main__":
    main()
