"""How much of a slow reward a strictly on-policy RL step hides: a benchmark, never a test.

The demo's RL settings (`oxrl_core/demo_rl.yaml`: 16 prompts x 8 samples of at most 16 tokens, two trainer ranks) on
the built-in tiny model, run with the math reward as it is and with a reward that first waits `--group-s` seconds
a group (`--group-s` / 8 per sample, a sleep that holds no CPU, as waiting on a sandbox or a remote service does),
alternately, `--repeats` runs each, every run a fresh process. Each group is scored as its last sample ends while
the engines sample the others, and a reward function scores `reward.workers` samples at once (default 8), so the
step should grow by much less than the sleep it adds (16 groups x `--group-s`). Reported: the median step time of
each setting (steps after the first), the sleep added per step, the growth and its share of that sleep.

    python benchmarks/reward_overlap.py --out benchmarks/results/<date>.<cpu>.reward-overlap.json [--group-s 0.5]
        [--repeats 3] [--steps 8] [KEY=VALUE ...]
"""

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import yaml
from alg_gains import run

from oxrl_core.demo import RL_CONFIG

HERE = Path(__file__).resolve().parent
RUN = (
    "import json, sys; from pathlib import Path; from rich.console import Console; "
    "from oxrl_core.demo import demo_data; from oxrl_core.resolve.run import resolve_run; "
    "from oxrl_core.loops.train import train; files = demo_data(0); "
    "run = resolve_run('rl', Path(sys.argv[1]), [f\"data.train=[{{path: {files['rl_train']}}}]\", *sys.argv[2:]]); "
    "times = []; train(run, resume=False, console=Console(file=sys.stderr), on_step=lambda step, m: "
    "times.append([m['time_step_s'], m.get('time_reward_s', 0.0), m['time_generate_s']])); print(json.dumps(times))"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--group-s", type=float, default=0.5, help="seconds the slow reward waits per group")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides for both settings")
    args = parser.parse_args()
    settings = yaml.safe_load(RL_CONFIG.read_text())
    settings["model"] = {"name_or_path": "oxrl-tiny"}
    settings["run"] |= {"save_final": False, "name": "reward-overlap"}
    settings["train"] |= {"steps": args.steps, "eval_every": 0}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config = args.out.with_suffix(".rl.yaml")
    config.write_text(yaml.safe_dump(settings))
    n, groups = settings["rollout"]["n_samples"], settings["train"]["batch_size"] // settings["rollout"]["n_samples"]
    slow = ["reward.func=slow_reward:math_after_delay", f"reward.kwargs={{delay_s: {args.group_s / n}}}"]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))  # slow_reward
    steps = {"plain": [], "slow": []}
    for repeat in range(args.repeats):
        for name, extra in (("plain", []), ("slow", slow)):
            times = run(RUN, str(config), *extra, *args.overrides)[1:]  # the first step compiles and allocates
            steps[name] += times
            print(f"run {repeat + 1} {name}: median step {statistics.median(t[0] for t in times):.2f} s", flush=True)
    median = {name: statistics.median(t[0] for t in times) for name, times in steps.items()}
    added = groups * args.group_s
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "groups_per_step": groups,
        "group_s": args.group_s,
        "sleep_added_per_step_s": added,
        "repeats": args.repeats,
        "overrides": args.overrides,
        "median_step_s": median,
        "median_reward_s": {name: statistics.median(t[1] for t in times) for name, times in steps.items()},
        "median_generate_s": {name: statistics.median(t[2] for t in times) for name, times in steps.items()},
        "growth_s": median["slow"] - median["plain"],
        "growth_share_of_sleep": (median["slow"] - median["plain"]) / added,
        "steps": steps,
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(
        f"step {median['plain']:.2f} s -> {median['slow']:.2f} s with {added:.1f} s of sleep added a step: grew by "
        f"{result['growth_s']:.2f} s, {result['growth_share_of_sleep']:.0%} of the sleep"
    )


if __name__ == "__main__":
    main()
