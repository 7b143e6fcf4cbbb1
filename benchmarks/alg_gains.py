"""How much each RL algorithm, and CISPO pipelined, raises `oxrl demo`'s SFT model on the demo task (the README's
algorithm table and its pipelined-RL table).

Per seed: the demo's data and SFT run once, then every algorithm's RL run from that SFT checkpoint with the demo's RL
settings (`oxrl_core/demo_rl.yaml`: 16 prompts x 8 samples, lr 3e-4, cosine schedule) for --steps steps (default 150,
half the demo's) and without its CISPO-specific advantage setting, so each algorithm keeps its own defaults.
Accuracy is the demo's: all 200 problems, sampled at temperature 1 (8 samples each) and greedy, before and after RL.
Every run is a fresh process; one JSON line per run goes to --out (appended: an interrupted sweep resumes where it
stopped), then the table is printed as Markdown.

    python benchmarks/alg_gains.py --out benchmarks/results/alg_gains.<cpu>.jsonl [--seeds 0 1 2] [--runs grpo dapo]
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from oxrl_core.demo import RL_CONFIG

ALGS = ["grpo", "dapo", "gspo", "dr-grpo", "rloo", "reinforce++", "reinforce++-baseline"]
# a run: its algorithm and settings; the demo's own RL (CISPO, no std scaling of advantages; with --steps 300 its
# length too) strictly on-policy, at lag 1 and asynchronous with a staleness bound of 2
DEMO = ("train.cispo.adv_std_norm=none",)
RUNS = {alg: (alg, ()) for alg in ALGS} | {
    "cispo": ("cispo", DEMO),
    "cispo-lag1": ("cispo", (*DEMO, "rollout.lag=1")),
    "cispo-async2": ("cispo", (*DEMO, "rollout.max_staleness=2")),
}
SFT = (
    "import json, sys; from rich.console import Console; from oxrl_core.demo import demo_data, train_demo_sft; "
    "seed = int(sys.argv[1]); s, _ = train_demo_sft(Console(file=sys.stderr), demo_data(seed), seed, f'gains-sft-seed{seed}'); "
    "print(json.dumps({'checkpoint': s['checkpoint']}))"
)
RL = (
    "import json, sys, time; from pathlib import Path; from rich.console import Console; "
    "from oxrl_core.demo import demo_data, train_demo_rl; "
    "seed, alg, checkpoint, config, steps, name = int(sys.argv[1]), *sys.argv[2:4], Path(sys.argv[4]), *sys.argv[5:7]; "
    "start = time.perf_counter(); "
    "r, steps = train_demo_rl(Console(file=sys.stderr), demo_data(seed), checkpoint, seed, name, "
    "config, (f'train.alg={alg}', f'train.steps={steps}', *sys.argv[7:])); "
    "print(json.dumps({'before': r['eval_before'], 'after': r['eval_after'], 'rl_steps': steps, "
    "'wall_time_s': time.perf_counter() - start}))"
)


def run(code: str, *argv: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=os.environ)
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", nargs="+", default=ALGS, choices=list(RUNS))
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    config = args.out.with_suffix(".rl.yaml")  # the demo's RL settings without CISPO's choice of advantage
    settings = yaml.safe_load(RL_CONFIG.read_text())
    for key in ("alg", "cispo"):
        settings["train"].pop(key)
    settings["train"]["eval_every"] = 0  # before and after only: evaluation does not touch training
    config.write_text(yaml.safe_dump(settings))
    for seed in args.seeds:
        for name in args.runs:
            rows = read(args.out)  # afresh: another sweep may share the file (say, one seed each)
            if any(
                r["kind"] == "rl" and r["seed"] == seed and r["alg"] == name and r["rl_steps"] == args.steps
                for r in rows
            ):
                continue
            sft = next(
                (r for r in rows if r["kind"] == "sft" and r["seed"] == seed and Path(r["checkpoint"]).exists()), None
            )
            if sft is None:
                sft = {"kind": "sft", "seed": seed, **run(SFT, str(seed))}
                append(args.out, sft)
            alg, overrides = RUNS[name]
            row = {
                "kind": "rl",
                "seed": seed,
                "alg": name,
                **run(
                    RL,
                    str(seed),
                    alg,
                    sft["checkpoint"],
                    str(config),
                    str(args.steps),
                    f"gains-{name.replace('+', 'p')}-seed{seed}",
                    *overrides,
                ),
            }  # run.name: no +
            append(args.out, row)
            print(f"{name} seed {seed}: sampled {gain(row):+.1f} points, {row['wall_time_s']:.0f} s", flush=True)
    print(table([r for r in read(args.out) if r["kind"] == "rl" and r["rl_steps"] == args.steps]))


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def append(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def gain(row: dict) -> float:
    return 100 * (row["after"]["eval_accuracy"] - row["before"]["eval_accuracy"])


def table(rows: list[dict]) -> str:
    """Run x seed: sampled accuracy before -> after (gain), greedy after, the RL run's wall time."""
    lines = [
        "| run | seed | sampled before | sampled after | gain (points) | greedy after | wall time |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (list(RUNS).index(r["alg"]), r["seed"])):
        lines.append(
            f"| {r['alg']} | {r['seed']} | {100 * r['before']['eval_accuracy']:.1f}% | "
            f"{100 * r['after']['eval_accuracy']:.1f}% | {gain(r):+.1f} | "
            f"{100 * r['after']['eval_accuracy_greedy']:.1f}% | {r['wall_time_s']:.0f} s |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
