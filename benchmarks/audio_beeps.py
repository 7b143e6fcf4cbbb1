"""The audio task on the CPU: SFT then CISPO of oxrl-tiny-audio on "How many beeps are in the clip?".

As the visual task (benchmarks/vlm_squares.py), on an audio model: half the SFT demonstrations give a count one off,
so imitation learns the format and to waver; CISPO with the exact-match `math` reward then raises accuracy. Accuracy
is measured with vLLM on the 64 held-out clips (sampled at T=1, pass@1 from 8 samples each, and greedy) after SFT and
after RL.

    python benchmarks/audio_beeps.py --seeds 0 1 2        # writes benchmarks/results/<date>.cpu.audio-beeps.json

`--seed` draws the training clips, the demonstrations' errors, the data order and the samples; the tiny model's
initial weights stay fixed. Results name the CPU they ran on.
"""

import random
from pathlib import Path

from rich.console import Console
from vlm_squares import seed_runs, sft_then_rl

from oxrl_core.preprocess.arithmetic import write_jsonl
from oxrl_core.preprocess.counting import beep_clips, prompt_records, sft_records


def run(seed: int, out: Path, sft_steps: int, rl_steps: int, console: Console) -> dict:
    data = out / f"data-seed{seed}"
    clips = beep_clips(2000, seed=1000 + seed)
    val = beep_clips(64, seed=1)
    files = {
        "sft_train": write_jsonl(sft_records(clips, 0.5, seed=seed), data / "sft_train.jsonl"),
        "sft_val": write_jsonl(sft_records(val, 0.0, seed=seed), data / "sft_val.jsonl"),
        "rl_train": write_jsonl(prompt_records(random.Random(seed).sample(clips, 1000)), data / "rl_train.jsonl"),
        "rl_val": write_jsonl(prompt_records(val), data / "rl_val.jsonl"),
    }
    result, _ = sft_then_rl(
        seed,
        out,
        files,
        sft_steps,
        rl_steps,
        console,
        sft=["model.name_or_path=oxrl-tiny-audio", "data.max_len=128"],
        rl=["train.eval_every=0", "rollout.max_prompt_len=96"],
    )
    return result


if __name__ == "__main__":
    seed_runs(__doc__, "audio-beeps", run, sft_steps=150, rl_steps=80)
