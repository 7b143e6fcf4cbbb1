"""`oxrl demo`, the embedded default: tiny model -> SFT on synthetic arithmetic -> before/after.

Accuracy is measured with greedy decoding in transformers on held-out problems:
the format is `<answer>N</answer>`, and the answer must equal N exactly.
"""

import os
import re
import time
from pathlib import Path

import torch
from rich.console import Console

from oxrl_core.config import load_sl_config
from oxrl_core.data.records import load_sft_examples
from oxrl_core.data.sft import collate_sft
from oxrl_core.loops.sl import train_sl
from oxrl_core.preprocess.arithmetic import arithmetic_problems, sft_records, write_jsonl
from oxrl_core.training.logprobs import token_logprobs

DEMO_CONFIG = Path(__file__).with_name("demo_sft.yaml")
ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def run_demo(console: Console) -> dict:
    data_dir = Path(os.environ.get("OXRL_DATA_DIR", "data")) / "arithmetic"
    train_file = write_jsonl(sft_records(arithmetic_problems(4000, seed=0)), data_dir / "sft_train.jsonl")
    val_file = write_jsonl(sft_records(arithmetic_problems(200, seed=1)), data_dir / "sft_val.jsonl")
    test_problems = arithmetic_problems(200, seed=2)
    run_name = time.strftime("demo-%Y%m%d-%H%M%S")
    config, model_path = load_sl_config(DEMO_CONFIG, [f"data.train=[{{path: {train_file}}}]", f"data.val={val_file}", f"run.name={run_name}"])

    start = time.perf_counter()
    before = evaluate(model_path, val_file, test_problems)
    console.print(f"before SFT: eval loss {before['eval_loss']:.3f}, answer accuracy {before['answer_accuracy']:.3f}")
    summary = train_sl(config, model_path, resume=False, console=console)
    after = evaluate(summary["checkpoint"], val_file, test_problems)
    return {"before": before, "after": after, "steps": config.train.steps,
            "wall_time_s": time.perf_counter() - start, "checkpoint": summary["checkpoint"]}


@torch.no_grad()
def evaluate(model_dir: str, val_file: Path, problems: list[dict]) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    examples, _ = load_sft_examples(val_file, tokenizer, max_len=128, strict=True)
    batch = collate_sft(examples, tokenizer.pad_token_id)
    logprobs = token_logprobs(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["input_ids"])
    eval_loss = (-(logprobs * batch["response_mask"]).sum() / batch["response_mask"].sum()).item()

    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True, tokenize=False)
               for p in problems]
    inputs = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**inputs, max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    replies = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    matches = [ANSWER.search(r) for r in replies]
    return {
        "eval_loss": eval_loss,
        "format_accuracy": sum(m is not None for m in matches) / len(problems),
        "answer_accuracy": sum(m is not None and m.group(1) == p["answer"] for m, p in zip(matches, problems)) / len(problems),
    }
