"""The seeded synthetic visual task of the vision-language examples and tests: "How many squares?".

Each image is 56 x 56 pixels (2 x 2 image tokens of `oxrl-tiny-vl`) on a grey
background with 1 to 4 squares of 12 pixels, each in its own 28 x 28 quadrant (so
no two touch) and in its own colour; the answer, `<answer>3</answer>`, is checked
exactly by the `math` reward. The same records come out for the same seed: drawn
with Pillow, written as PNG, kept in the records as base64 strings.
"""

import base64
import io
import random

QUESTION = "How many squares are in the picture? Answer as <answer>N</answer>."
SIZE, SQUARE = 56, 12
COLOURS = [(220, 40, 40), (40, 160, 40), (40, 70, 220), (230, 200, 30)]


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


def _prompt() -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]


def vlm_sft_records(problems: list[dict], wrong_share: float, seed: int) -> list[dict]:
    """TRL's vision SFT format (`images` + `messages`); in about `wrong_share` of them the demonstrated count is one
    off (drawn per record): demonstrations a verifier would catch and imitation cannot, as in the text demo."""
    rng = random.Random(seed)
    records = []
    for p in problems:
        answer = int(p["answer"])
        if rng.random() < wrong_share:
            answer += -1 if answer == 4 else 1
        records.append({"images": [p["image"]], "messages": _prompt() + [
            {"role": "assistant", "content": f"<answer>{answer}</answer>"}]})
    return records


def vlm_preference_records(problems: list[dict], seed: int) -> list[dict]:
    """TRL's vision preference format: the prompt with its image part, the right count over a wrong one."""
    rng = random.Random(seed)
    records = []
    for p in problems:
        wrong = rng.choice([c for c in range(1, 5) if str(c) != p["answer"]])
        records.append({"images": [p["image"]], "prompt": _prompt(), "chosen": f"<answer>{p['answer']}</answer>",
                        "rejected": f"<answer>{wrong}</answer>"})
    return records


def vlm_prompt_records(problems: list[dict]) -> list[dict]:
    """RL prompts: the prompt with its image part and the `answer` the math reward checks."""
    return [{"images": [p["image"]], "prompt": _prompt(), "answer": p["answer"]} for p in problems]
