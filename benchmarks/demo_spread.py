"""How far `oxrl demo`'s result moves across seeds and CPU numerics (the README's demo table).

Runs the demo (SFT then CISPO, as `oxrl demo --seed N` does) once per seed and variant, each in a fresh process:
`ATEN_CPU_CAPABILITY=avx2` forces torch's AVX2 kernels on an AVX-512 machine (on a machine whose kernels are AVX2
already those runs would repeat the default ones, and are skipped), and OMP_NUM_THREADS=1 against 2 changes the order
of reductions, so the spread of another machine shows up on this one. One JSON line per run goes to
--out (appended: an interrupted sweep resumes where it stopped); the summary gives the smallest gain and the range.

    python benchmarks/demo_spread.py --out benchmarks/results/demo_spread.<cpu>.jsonl [--seeds 0 1 2 3 4]
"""

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

RUN = (
    "import json, sys; from rich.console import Console; from oxrl_core.demo import run_demo; "
    "r = run_demo(Console(file=sys.stderr), int(sys.argv[1])); "
    "print(json.dumps({k: r[k] for k in ('after_sft', 'after_rl', 'wall_time_s', 'sft_steps', 'rl_steps')}))"
)
VARIANTS = {"default": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2"}}


def kernels(variant_env: dict) -> str:
    """The CPU kernels torch picks under `variant_env` (AVX512, AVX2, ...), asked in a fresh process."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return subprocess.run(
        [sys.executable, "-c", probe], env=os.environ | variant_env, capture_output=True, text=True, check=True
    ).stdout.strip()


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1], help="OMP_NUM_THREADS values")
    args = parser.parse_args()
    done = (
        {(r["seed"], r["variant"], r["threads"]) for r in map(json.loads, args.out.read_text().splitlines())}
        if args.out.exists()
        else set()
    )
    native = kernels({})
    for variant, threads, seed in itertools.product(VARIANTS, args.threads, args.seeds):
        if (seed, variant, threads) in done:
            continue
        forced = kernels(VARIANTS[variant]) if VARIANTS[variant] else native
        if VARIANTS[variant] and forced == native:  # nothing to force: the default runs are these
            print(
                f"seed {seed} {variant} threads {threads}: skipped, torch's kernels here are {native} already",
                flush=True,
            )
            continue
        env = os.environ | VARIANTS[variant] | {"OMP_NUM_THREADS": str(threads)}
        result = subprocess.run([sys.executable, "-c", RUN, str(seed)], env=env, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"seed {seed} {variant} threads {threads} failed:\n{result.stderr[-3000:]}")
        row = {
            "seed": seed,
            "variant": variant,
            "threads": threads,
            "kernels": forced,
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            **json.loads(result.stdout.strip().splitlines()[-1]),
        }
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(summary_line(row), flush=True)
    rows = [json.loads(line) for line in args.out.read_text().splitlines()]
    for kind in ("sampled", "greedy"):
        gains = [100 * (r["after_rl"][key(kind)] - r["after_sft"][key(kind)]) for r in rows]
        print(f"{kind}: gain {min(gains):+.1f} to {max(gains):+.1f} points over {len(rows)} runs")
    times = [r["wall_time_s"] for r in rows]
    print(f"wall time {min(times):.0f}-{max(times):.0f} s on {rows[0]['cpu']} ({rows[0]['cores']} cores)")


def key(kind: str) -> str:
    return "eval_accuracy" if kind == "sampled" else "eval_accuracy_greedy"


def summary_line(row: dict) -> str:
    accuracy = " ".join(
        f"{kind} {100 * row['after_sft'][key(kind)]:.1f}% -> {100 * row['after_rl'][key(kind)]:.1f}%"
        for kind in ("sampled", "greedy")
    )
    return f"seed {row['seed']} {row['variant']:7s} threads {row['threads']}: {accuracy}  {row['wall_time_s']:.0f} s"


if __name__ == "__main__":
    main()
