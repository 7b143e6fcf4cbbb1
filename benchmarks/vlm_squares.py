"""The visual task on the CPU: SFT then CISPO of oxrl-tiny-vl on "How many squares are in the picture?".

As the text demo, on a vision-language model: half the SFT demonstrations give a count one off, so imitation learns
the format and to waver; CISPO with the exact-match `math` reward then raises accuracy. Accuracy is measured with
vLLM on the 64 held-out pictures (sampled at T=1, pass@1 from 8 samples each, and greedy) after SFT and after RL.

    python benchmarks/vlm_squares.py --seeds 0 1 2        # writes benchmarks/results/<date>.cpu.vlm-squares.json

`--seed` draws the training pictures, the demonstrations' errors, the data order and the samples; the tiny model's
initial weights stay fixed. Results name the CPU they ran on.
"""

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

from rich.console import Console

from oxrl_core.loops.train import train
from oxrl_core.preprocess.arithmetic import write_jsonl
from oxrl_core.preprocess.counting import prompt_records, sft_records, square_images
from oxrl_core.resolve.run import resolve_run

DEMO = Path(__file__).resolve().parents[1] / "oxrl_core"


def run(seed: int, out: Path, sft_steps: int, rl_steps: int, console: Console) -> dict:
    data = out / f"data-seed{seed}"
    pictures = square_images(2000, seed=1000 + seed)
    val = square_images(64, seed=1)  # the shipped examples' held-out pictures
    files = {
        "sft_train": write_jsonl(sft_records(pictures, 0.5, seed=seed), data / "sft_train.jsonl"),
        "sft_val": write_jsonl(sft_records(val, 0.0, seed=seed), data / "sft_val.jsonl"),
        "rl_train": write_jsonl(prompt_records(random.Random(seed).sample(pictures, 1000)), data / "rl_train.jsonl"),
        "rl_val": write_jsonl(prompt_records(val), data / "rl_val.jsonl"),
    }
    result, _ = sft_then_rl(
        seed,
        out,
        files,
        sft_steps,
        rl_steps,
        console,
        sft=["model.name_or_path=oxrl-tiny-vl", "data.max_len=64"],
        rl=["train.eval_every=0"],
    )
    return result


def sft_then_rl(
    seed: int,
    out: Path,
    files: dict[str, Path],
    sft_steps: int,
    rl_steps: int,
    console: Console,
    sft: list[str],
    rl: list[str],
) -> tuple[dict, list[dict]]:
    """SFT from the demo's config on `files`' sft_train/sft_val (with `sft` overrides), then CISPO from its checkpoint
    on rl_train/rl_val (with `rl`): a seed's report (accuracy after each, wall time) and CISPO's step history."""
    start = time.perf_counter()
    common = [f"run.output_dir={out}", f"train.seed={seed}"]
    sft_run = train(
        resolve_run(
            "sl",
            DEMO / "demo_sft.yaml",
            common
            + [
                f"data.train=[{{path: {files['sft_train']}}}]",
                f"data.val={files['sft_val']}",
                f"run.name=sft-seed{seed}",
                f"train.steps={sft_steps}",
                *sft,
            ],
        ),
        resume=False,
        console=console,
    )
    rl_run = train(
        resolve_run(
            "rl",
            DEMO / "demo_rl.yaml",
            common
            + [
                f"model.name_or_path={sft_run['checkpoint']}",
                f"data.train=[{{path: {files['rl_train']}}}]",
                f"data.val={files['rl_val']}",
                f"run.name=rl-seed{seed}",
                f"train.steps={rl_steps}",
                *rl,
            ],
        ),
        resume=False,
        console=console,
    )
    return (
        {
            "seed": seed,
            "sft_steps": sft_steps,
            "rl_steps": rl_steps,
            "sft_eval_loss": sft_run["eval_loss"],
            "after_sft": rl_run["eval_before"],
            "after_rl": rl_run["eval_after"],
            "wall_time_s": time.perf_counter() - start,
        },
        rl_run["history"],
    )


def main() -> None:
    seed_runs(__doc__, "vlm-squares", run, sft_steps=400, rl_steps=150)


def seed_runs(doc: str, task: str, run, sft_steps: int, rl_steps: int) -> list[dict]:
    """A CPU task's command line (--seeds, --sft-steps, --rl-steps, --out), `run(seed, out, sft_steps, rl_steps,
    console)` for each seed, then the report (write_report)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sft-steps", type=int, default=sft_steps)
    parser.add_argument("--rl-steps", type=int, default=rl_steps)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OXRL_CHECKPOINT_DIR", "checkpoints")) / task)
    args = parser.parse_args()
    console = Console()
    results = [run(seed, args.out, args.sft_steps, args.rl_steps, console) for seed in args.seeds]
    write_report(task, results, console)
    return results


def write_report(task: str, results: list[dict], console: Console) -> Path:
    """`results/<date>.cpu.<task>.json`, naming the CPU, and a line a seed: accuracy after SFT and after RL."""
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    report = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "cores": os.cpu_count(), "runs": results}
    path = Path(__file__).parent / "results" / f"{report['date']}.cpu.{task}.json"
    path.write_text(json.dumps(report, indent=2))
    for r in results:
        console.print(
            f"seed {r['seed']}: sampled {r['after_sft']['eval_accuracy']:.1%} -> {r['after_rl']['eval_accuracy']:.1%}, "
            f"greedy {r['after_sft']['eval_accuracy_greedy']:.1%} -> {r['after_rl']['eval_accuracy_greedy']:.1%}, "
            f"{r['wall_time_s']:.0f} s"
        )
    console.print(f"written: {path}")
    return path


if __name__ == "__main__":
    main()
