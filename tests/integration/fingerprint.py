"""Fingerprints: the numbers each algorithm's integration run gives, recorded (2026-11-28, a 2-core Intel Xeon CPU)
so that a change meant to keep them (a refactor, a move) is caught when it does not.

The integration tests that train an algorithm pass their run's summary here. Every recorded number of every step (the loss,
grad norm, rewards, PPO's value loss, the judge's and the reward model's scores through `reward_mean`, the eval
metrics), timings and memory aside, must equal the recorded one within 1e-6 relative
(the recorded runs gave bit-equal numbers on the machine that recorded them; 1e-6 leaves room only for a changed
order of float operations). The numbers of a float32 CPU run depend on the CPU's kernels (AVX2 or AVX-512), and a
sampled token may flip with them: the comparison runs on the CPU model that recorded them.

Record anew (after a deliberate change of the numbers): `OXRL_RECORD_FINGERPRINTS=1 make test-all`.
"""

import json
import math
import os
from pathlib import Path

import pytest

FILE = Path(__file__).with_name("fingerprints.json")
NOT_NUMERICS = ("time_", "tokens_per_s", "step_time_s", "peak_memory", "wall_time")
TOLERANCE = 1e-6


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def numbers(summary: dict) -> dict:
    """What the fingerprint keeps of a run's summary: per step, and before and after training, every number."""
    def kept(entry: dict) -> dict:
        return {k: v for k, v in entry.items()
                if isinstance(v, (int, float)) and not any(part in k for part in NOT_NUMERICS)}

    out = {f"step {h['step']}": kept(h) for h in summary["history"]}
    for key in ("eval_before", "eval_after"):
        if key in summary:
            out[key] = kept(summary[key])
    return out


def check_fingerprint(name: str, summary: dict) -> None:
    recorded = json.loads(FILE.read_text()) if FILE.is_file() else {"cpu": cpu_model(), "runs": {}}
    if os.environ.get("OXRL_RECORD_FINGERPRINTS"):
        recorded["cpu"] = cpu_model()
        recorded["runs"][name] = numbers(summary)
        FILE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        return
    if recorded["cpu"] != cpu_model():
        pytest.skip(f"fingerprints were recorded on {recorded['cpu']}, this CPU is {cpu_model()}")
    expected, got = recorded["runs"][name], numbers(summary)
    assert got.keys() == expected.keys(), (name, sorted(got), sorted(expected))
    for where, values in expected.items():
        # a metric logged since the recording is not a change of the numbers; a recorded one missing is
        assert values.keys() <= got[where].keys(), (name, where, sorted(got[where]), sorted(values))
        for key, value in values.items():
            assert math.isclose(got[where][key], value, rel_tol=TOLERANCE, abs_tol=TOLERANCE) or (
                math.isnan(value) and math.isnan(got[where][key])), (name, where, key, got[where][key], value)
