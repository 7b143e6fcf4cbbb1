"""The seeded synthetic counting tasks of the multimodal examples and tests: "How many squares?" in a picture, "How
many beeps?" in a clip.

Squares: each image is 56 x 56 pixels (2 x 2 image tokens of `oxrl-tiny-vl`) on a grey
background with 1 to 4 squares of 12 pixels, each in its own 28 x 28 quadrant (so no two
touch) and in its own colour; written as PNG.

Beeps: each clip is 1 s of silence at 8 kHz with 1 to 4 beeps of 120 ms, each in its
own quarter of a second (so no two touch) and at its own pitch; written as FLAC (the
models' 16 kHz is reached by resampling at load, data/audio.py).

The answer, `<answer>3</answer>`, is checked exactly by the `math` reward. The same
records come out for the same seed; media are kept in the records as base64 strings.
The shipped examples/data/beeps_* hold beep_clips(128, seed=0) for training (half the
demonstrations one off, seed 0) and beep_clips(32, seed=1) held out.
"""

import base64
import io
import random

QUESTIONS = {
    "image": "How many squares are in the picture? Answer as <answer>N</answer>.",
    "audio": "How many beeps are in the clip? Answer as <answer>N</answer>.",
}
SIZE, SQUARE = 56, 12
COLOURS = [(220, 40, 40), (40, 160, 40), (40, 70, 220), (230, 200, 30)]
RATE, BEEP_SECONDS = 8000, 0.12
PITCHES = [440.0, 660.0, 880.0, 1320.0]


def square_images(n: int, seed: int) -> list[dict]:
    """`n` problems `{"image": base64 PNG, "answer": "1".."4"}`, the same for the same seed."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    problems = []
    for _ in range(n):
        count = rng.randint(1, 4)
        image = Image.new("RGB", (SIZE, SIZE), (128, 128, 128))
        draw = ImageDraw.Draw(image)
        for quadrant, colour in zip(rng.sample(range(4), count), rng.sample(COLOURS, count)):
            x = (quadrant % 2) * 28 + rng.randint(0, 28 - SQUARE)
            y = (quadrant // 2) * 28 + rng.randint(0, 28 - SQUARE)
            draw.rectangle((x, y, x + SQUARE - 1, y + SQUARE - 1), fill=colour)
        png = io.BytesIO()
        image.save(png, format="PNG")
        problems.append({"image": base64.b64encode(png.getvalue()).decode(), "answer": str(count)})
    return problems


def beep_clips(n: int, seed: int) -> list[dict]:
    """`n` problems `{"audio": base64 FLAC, "answer": "1".."4"}`, the same for the same seed."""
    import numpy as np
    import soundfile

    rng = random.Random(seed)
    t = np.arange(int(RATE * BEEP_SECONDS)) / RATE
    envelope = np.minimum(1.0, np.minimum(t, BEEP_SECONDS - t) / 0.01)  # 10 ms fades: no clicks
    problems = []
    for _ in range(n):
        count = rng.randint(1, 4)
        clip = np.zeros(RATE)
        for quarter, pitch in zip(rng.sample(range(4), count), rng.sample(PITCHES, count)):
            start = quarter * RATE // 4 + rng.randint(0, RATE // 4 - len(t))
            clip[start : start + len(t)] += 0.5 * envelope * np.sin(2 * np.pi * pitch * t)
        flac = io.BytesIO()
        soundfile.write(flac, clip, RATE, format="FLAC")
        problems.append({"audio": base64.b64encode(flac.getvalue()).decode(), "answer": str(count)})
    return problems


def _kind(problem: dict) -> str:
    return "image" if "image" in problem else "audio"


def _prompt(kind: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": QUESTIONS[kind]}]}]


def sft_records(problems: list[dict], wrong_share: float, seed: int) -> list[dict]:
    """TRL's multimodal SFT format (`images` or `audios` beside `messages`); in about `wrong_share` of them the
    demonstrated count is one off (drawn per record): demonstrations a verifier would catch and imitation cannot, as
    in the text demo."""
    rng = random.Random(seed)
    records = []
    for p in problems:
        kind, answer = _kind(p), int(p["answer"])
        if rng.random() < wrong_share:
            answer += -1 if answer == 4 else 1
        records.append(
            {
                f"{kind}s": [p[kind]],
                "messages": _prompt(kind) + [{"role": "assistant", "content": f"<answer>{answer}</answer>"}],
            }
        )
    return records


def preference_records(problems: list[dict], seed: int) -> list[dict]:
    """TRL's multimodal preference format: the prompt with its media part, the right count over a wrong one."""
    rng = random.Random(seed)
    records = []
    for p in problems:
        kind, wrong = _kind(p), rng.choice([c for c in range(1, 5) if str(c) != p["answer"]])
        records.append(
            {
                f"{kind}s": [p[kind]],
                "prompt": _prompt(kind),
                "chosen": f"<answer>{p['answer']}</answer>",
                "rejected": f"<answer>{wrong}</answer>",
            }
        )
    return records


def prompt_records(problems: list[dict]) -> list[dict]:
    """RL prompts: the prompt with its media part and the `answer` the math reward checks."""
    return [{f"{_kind(p)}s": [p[_kind(p)]], "prompt": _prompt(_kind(p)), "answer": p["answer"]} for p in problems]
