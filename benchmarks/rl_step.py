"""One RL step on a GPU, phase by phase: a benchmark, never a test.

A random-weight model of Qwen2.5-0.5B's shape (494M parameters; `--shape 7b`: Qwen2.5-7B's, 7.6B; `--shape 32b`;
`--shape vl-3b`: Qwen2.5-VL-3B's, 3.8B, a vision-language model whose every prompt also holds one 448x448 image, 256
image tokens after the prompt's 128) is built locally; 64 prompts of 128 tokens x 8 samples x 512 new tokens per
GPU (`--gpus N`: N colocated trainer ranks and engines; or split, given `rollout.placement=split` and how many ranks
and engines share the N GPUs) go through
`train` (`oxrl_core.loops.train`), the same loop as `oxrl train rl`. Reported, as the median over the steps after the
first (which compiles and allocates; asynchronously, between the first 1 + `rollout.max_staleness`, which find
batches sampled ahead during the first, and the last `rollout.max_staleness`, whose batches are sampled with no later
ones queued behind them), and step by step: time and tokens/s of
each phase (generate, reward, trainer logprobs, train, refresh), the training
phase's MFU against the H100's (and H200's) 989 TFLOP/s dense bf16 peak per trainer GPU, peak memory of the fullest GPU;
and, first, standalone vLLM (the same engine class, no Ray, no trainer, in a fresh
process of its own, gone before the run starts) generates the same batch three
times (the median of the last two counts), for the rollout phase's share of
standalone throughput: twice, with torch's default threads and with one thread as
Ray gives the loop's engine actor (OMP_NUM_THREADS=1 for an actor of under one CPU);
the faster is the reference. After the loop, standalone vLLM with one thread once more (has the host slowed?), and
for each of the loop's rollout phases the processes that used the CPU and the GPU's clock meanwhile.

`--turns N` (0.5B shape) makes each sample an episode of up to N policy messages against the guess-the-number
environment, about as many policy tokens as one 512-token response in all: the model's end-of-turn token is made
likely enough that a message ends after about 512 / N tokens (`end_turns_after`; random weights would never end
one), each message at most 512 tokens. Its figures, policy tokens generated per second above all, compare with the
single-turn run's. `--long-tail` makes one response a sample with the same model trick, of geometric length (mean
600 tokens, cut at 4,096: the longest of a step's 512 is about 3,700), the workload pipelined RL is for;
`--slow-reward S` waits S seconds per sample before the math reward, as a code sandbox or a remote judge would.

    python benchmarks/rl_step.py --out results/ [--shape 0.5b|7b|32b|vl-3b] [--gpus N] [--tensor-parallel K] [--turns N]
        [--long-tail] [--slow-reward S] [KEY=VALUE ...]
    # overrides as for `oxrl train rl`; split on 8 GPUs (4096 samples = 4 ranks x 32 sequences x 32), e.g.:
    python benchmarks/rl_step.py --out results/ --gpus 8 --no-standalone rollout.placement=split
        run.train_ranks=4 rollout.engines=4 train.grad_accum=32
"""

import argparse
import json
import math
import multiprocessing
import shutil
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import yaml
from rich.console import Console

from oxrl_core.data.records import prompt_messages
from oxrl_core.loops.train import train
from oxrl_core.models.families.qwen2_vl import VISION_TOKENS
from oxrl_core.models.tiny import build_tiny_model
from oxrl_core.resolve.run import resolve_run

PEAK_FLOPS = 989e12  # H100 SXM dense bf16
PROMPTS, SAMPLES, PROMPT_TOKENS, NEW_TOKENS = 64, 8, 128, 512
LONG_TAIL_MEAN, LONG_TAIL_CAP = 600, 4096  # --long-tail: geometric response lengths; about 1 in 1,000 reaches the cap
QWEN25_SHAPES = {
    "0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "7b": dict(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
    "32b": dict(
        vocab_size=152064,
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
}
# Qwen2.5-VL-3B-Instruct's config.json: the language model, and the vision tower (32 blocks, windowed attention but
# in 4) whose 2x2-merged patches become the image's tokens
QWEN25_VL_SHAPES = {
    "vl-3b": dict(
        text_config=dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=2,
            max_position_embeddings=128000,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]},
        ),
        vision_config=dict(
            depth=32,
            hidden_size=1280,
            intermediate_size=3420,
            num_heads=16,
            out_hidden_size=2048,
            hidden_act="silu",
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            fullatt_block_indexes=[7, 15, 23, 31],
        ),
        tie_word_embeddings=True,
    ),
}
# One shape per model family besides Qwen2.5's: the smallest registry entry's (`entry`) language model, from its
# config.json on the Hub. The family's tiny model gives everything else (tokenizer and template, RoPE scaling, soft-capping, token
# ids, Qwen3.5's vision tower); its tokenizer's ids are a few hundred of the real vocabulary's. Qwen3.5-27B's 64
# layers are cut to 16 in the same 3:1 pattern of linear and full attention: its bf16 weights (55 GB) once in the
# trainer and once in vLLM do not fit one 80 GB GPU together.
FAMILY_SHAPES = {
    "llama-1b": dict(
        entry="meta-llama/Llama-3.2-1B-Instruct",
        tiny="oxrl-tiny-llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        tie_word_embeddings=True,
    ),
    "mistral-7b": dict(
        entry="mistralai/Mistral-7B-Instruct-v0.3",
        tiny="oxrl-tiny-mistral",
        vocab_size=32768,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
    ),
    "gemma2-2b": dict(  # sliding (4,096) and global layers alternating
        entry="google/gemma-2-2b-it",
        tiny="oxrl-tiny-gemma2",
        vocab_size=256000,
        hidden_size=2304,
        intermediate_size=9216,
        num_hidden_layers=26,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=4096,
        layer_types=["sliding_attention", "full_attention"] * 13,
    ),
    "gemma3-1b": dict(  # five sliding (512) layers to a global one
        entry="google/gemma-3-1b-it",
        tiny="oxrl-tiny-gemma3",
        vocab_size=262144,
        hidden_size=1152,
        intermediate_size=6912,
        num_hidden_layers=26,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=512,
        layer_types=["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(26)],
    ),
    "phi3-3.8b": dict(  # fused qkv_proj and gate_up_proj
        entry="microsoft/Phi-3.5-mini-instruct",
        tiny="oxrl-tiny-phi3",
        vocab_size=32064,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        tie_word_embeddings=False,
    ),
    "qwen3-0.6b": dict(  # q/k norms
        entry="Qwen/Qwen3-0.6B",
        tiny="oxrl-tiny-qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ),
    "qwen3-30b-a3b": dict(  # 128 experts, 8 a token; LoRA (the registry's recipe) on one H200
        entry="Qwen/Qwen3-30B-A3B",
        tiny="oxrl-tiny-qwen3-moe",
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_local_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        tie_word_embeddings=False,
    ),
    "qwen3.5-27b-16l": dict(  # at 16 of its 64 layers
        entry="Qwen/Qwen3.5-27B",
        tiny="oxrl-tiny-qwen3-5",
        vocab_size=248320,
        hidden_size=5120,
        intermediate_size=17408,
        num_hidden_layers=16,
        layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(16)],
        num_attention_heads=24,
        num_key_value_heads=4,
        head_dim=256,
        # its rotary quarter of 256 dimensions, split over M-RoPE's three axes (the tiny model's split is of 64)
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        tie_word_embeddings=False,
    ),
}
# Qwen3-30B-A3B's bf16 weights (61 GB) twice, the trainer's and vLLM's, fit an H200 but not an 80 GB H100: on that, 20
# of its 48 layers (25 GB)
FAMILY_SHAPES["qwen3-30b-a3b-20l"] = FAMILY_SHAPES["qwen3-30b-a3b"] | {"num_hidden_layers": 20}
SHAPES = QWEN25_SHAPES | QWEN25_VL_SHAPES | FAMILY_SHAPES
IMAGE_SIDE = 448  # pixels: 32 x 32 patches of 14, merged 2 x 2 into 16 x 16 image tokens
IMAGE_PATCHES, IMAGE_TOKENS = (IMAGE_SIDE // 14) ** 2, (IMAGE_SIDE // 28) ** 2

# the sampler-trainer gap of each step, and what `train.sampler_correction` did about it
MISMATCH = ["logprob_gap_abs", "logprob_gap_kl", "is_ratio_max", "is_corrected_frac"]


def build_model(folder: Path, shape: dict) -> Path:
    """Random weights in a Qwen2.5 shape, with oxrl-tiny's ChatML tokenizer (ids beyond it are never decoded); a
    vision shape with oxrl-tiny-vl's tokenizer and template, and Qwen2.5-VL's image processor."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer, Qwen2Config

    if (folder / "config.json").is_file():
        return folder
    if "tiny" in shape:
        return build_family_model(folder, shape)
    vision = "vision_config" in shape
    tiny = "oxrl-tiny-vl" if vision else "oxrl-tiny"
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(folder.parent / tiny, tiny))
    tokens = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    torch.manual_seed(0)
    if vision:
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

        ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
        config = Qwen2_5_VLConfig(
            text_config=shape["text_config"] | tokens,
            vision_config=shape["vision_config"],
            tie_word_embeddings=shape["tie_word_embeddings"],
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
        )
        # images up to the benchmark's own size: vLLM sizes its encoder's profile run by the largest image allowed
        Qwen2_5_VLProcessor(
            image_processor=Qwen2VLImageProcessor(max_pixels=IMAGE_SIDE**2),
            tokenizer=tokenizer,
            video_processor=Qwen2VLVideoProcessor(),
            chat_template=tokenizer.chat_template,
        ).save_pretrained(folder)
    else:
        config = Qwen2Config(**shape, **tokens)
    save_random_weights(AutoModelForImageTextToText if vision else AutoModelForCausalLM, config, folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_random_weights(model_class, config, folder: Path) -> None:
    """`model_class`'s bf16 weights for `config`, drawn where the GPU is (a 7B model's random init takes minutes on a
    CPU) after the caller seeded torch, saved into `folder`."""
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = model_class.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()  # nothing where CUDA never started


def build_family_model(folder: Path, shape: dict) -> Path:
    """Random bf16 weights in a FAMILY_SHAPES shape (`family_config`), beside the family's tiny model's tokenizer,
    template and processor files."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from oxrl_core.models.names import restore_checkpoint_names

    tiny = build_tiny_model(folder.parent / shape["tiny"], shape["tiny"])
    config = family_config(tiny, shape)
    folder.mkdir(parents=True)
    for file in tiny.iterdir():
        if file.is_file() and not file.name.startswith((".", "model")) and file.name != "config.json":
            shutil.copy(file, folder / file.name)
    torch.manual_seed(0)
    multimodal = hasattr(config, "text_config")
    save_random_weights(AutoModelForImageTextToText if multimodal else AutoModelForCausalLM, config, folder)
    restore_checkpoint_names(folder, config.model_type)
    return folder


def family_config(tiny: Path, shape: dict):
    """The family's tiny model's config (at `tiny`) with the shape's widths (its language model's, for a multimodal
    class)."""
    from transformers import AutoConfig

    widths = {key: value for key, value in shape.items() if key not in ("tiny", "entry")}
    config = AutoConfig.from_pretrained(tiny)
    multimodal = hasattr(config, "text_config")
    text = config.text_config if multimodal else config
    tiny_widths = {key: value for key, value in text.to_dict().items() if key != "layer_types"}  # of its 2 layers
    text = type(text)(**(tiny_widths | widths | {"dtype": "bfloat16"}))
    if not multimodal:
        return text
    config.text_config = text
    config.tie_word_embeddings = text.tie_word_embeddings
    return config


def write_prompts(model: Path, path: Path, count: int, vision: bool = False, as_text: bool = False) -> Path:
    """`count` records whose chat-templated prompt is exactly PROMPT_TOKENS tokens long; with `vision`, each also
    holds one IMAGE_SIDE-square image of seeded noise (its IMAGE_TOKENS tokens come on top); with `as_text`, the prompt
    is the user message's text (as an environment's episode opens)."""
    from PIL import Image
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    content = lambda text: [{"type": "image"}, {"type": "text", "text": text}] if vision else text
    # an image part renders as one placeholder token, which the data loader expands to the image's tokens
    length = lambda text: (
        len(
            tokenizer.apply_chat_template([{"role": "user", "content": content(text)}], add_generation_prompt=True)[
                "input_ids"
            ]
        )
        - vision
    )
    records, texts = [], []
    for i in range(count):
        text = f"Problem {i}: what is {i} + {i}?"
        while length(text) < PROMPT_TOKENS:
            text += f" {(i * 7 + len(text)) % 10}"
        while length(text) > PROMPT_TOKENS:
            text = text[:-1].rstrip()  # as templates that trim the message (Llama's, Gemma's) would
        # a whitespace and a digit can be two tokens, and the way down skip the length: one more character
        if length(text) < PROMPT_TOKENS:
            text += next((c for c in ",.;0123456789" if length(text + c) == PROMPT_TOKENS), "")
        texts.append(text)
        record = {"prompt": text if as_text else [{"role": "user", "content": content(text)}], "answer": str(2 * i)}
        if vision:
            image = path.parent / "images" / f"{i}.png"
            image.parent.mkdir(exist_ok=True)
            noise = torch.randint(
                0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(i)
            )
            Image.fromarray(noise.numpy()).save(image)
            record["images"] = [str(image)]
        records.append(record)
    assert {length(text) for text in texts} == {PROMPT_TOKENS}
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


class GpuMonitor:
    """Device-wide memory in use (every process: vLLM and the trainer), SM clock, utilisation and power of the fullest
    GPU, sampled through NVML every 50 ms: the fullest, since Ray need not give a run of fewer GPUs than the machine
    has its GPU 0."""

    def __enter__(self):
        import pynvml

        pynvml.nvmlInit()
        gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.peak_gb, self.samples, self._stop = 0.0, [], threading.Event()

        def sample():
            while not self._stop.wait(0.05):
                used_gb, handle = max(
                    ((pynvml.nvmlDeviceGetMemoryInfo(gpu).used / 2**30, gpu) for gpu in gpus), key=lambda x: x[0]
                )
                self.peak_gb = max(self.peak_gb, used_gb)
                self.samples.append(
                    (
                        time.perf_counter(),
                        pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                        pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                        pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                    )
                )

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def between(self, start: float, end: float) -> dict:
        """Means of the samples taken between `start` and `end` (perf_counter seconds)."""
        inside = [x for x in self.samples if start <= x[0] <= end] or [(0, 0, 0, 0)]
        return {
            key: round(statistics.mean(x[i] for x in inside), 1)
            for i, key in ((1, "sm_clock_mhz"), (2, "gpu_util_percent"), (3, "power_w"))
        }


def _cpu_seconds() -> dict[int, tuple[str, float]]:
    """Every process's (title, user + system CPU seconds so far); Ray titles its workers `ray::Actor.method`."""
    import psutil

    seconds = {}
    for proc in psutil.process_iter(["cmdline", "name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if times is not None:
            title = " ".join(proc.info["cmdline"] or [proc.info["name"] or "?"])[:70]
            seconds[proc.pid] = (title, times.user + times.system)
    return seconds


def watch_rollouts(monitor: GpuMonitor) -> list[dict]:
    """Each rollout phase of the loop (`PolicyGradient.sample`, wrapped: a step's batch sampled and scored): its
    seconds, the processes that used the most CPU during it (CPU seconds per wall second) and the GPU's clock,
    utilisation and power meanwhile. Says whether a later step's slower rollout is the engine working more, or
    waiting, or something beside it."""
    from oxrl_core.loops.recipes.policy_gradient import PolicyGradient

    windows, generate = [], PolicyGradient.sample

    def watched(self, *args, **kwargs):
        before, start = _cpu_seconds(), time.perf_counter()
        result = generate(self, *args, **kwargs)
        end, after = time.perf_counter(), _cpu_seconds()
        used = sorted(
            ((after[pid][1] - before[pid][1], after[pid][0]) for pid in after.keys() & before.keys()), reverse=True
        )
        windows.append(
            {
                "seconds": round(end - start, 3),
                **monitor.between(start, end),
                "cpu_per_wall_s": [[round(cpu / (end - start), 2), title] for cpu, title in used[:6]],
            }
        )
        return result

    PolicyGradient.sample = watched
    return windows


def end_turns_after(folder: Path, prompts: Path, mean_tokens: int) -> Path:
    """A copy of the random model `folder` that ends a message after `mean_tokens` tokens on average, after any prompt
    (random weights never end one). Its last layer's value bias adds one large constant vector to every position's
    residual stream (attention's weights sum to 1, so the bias passes through whole), so that every final hidden
    state points nearly the same way (cosine > 0.999) and the model samples every token from nearly the same
    distribution; the end-of-turn token's (<|im_end|>) output row is set along that direction, scaled for a
    probability of 1 / `mean_tokens`: message lengths are geometric. What a step computes is unchanged. (Random
    weights as they are: the chance to end a message differed 13-fold between two of the benchmark's prompts, and
    half the messages ran to 512 tokens.) The 0.5B shape ties the row to the token's input embedding; the 7B shape's
    head is its own."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = folder.parent / f"{folder.name}-turns-of-{mean_tokens}"
    if (out / "config.json").is_file():
        return out
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(device)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = tokenizer.apply_chat_template(
        prompt_messages(json.loads(prompts.read_text().splitlines()[0])), add_generation_prompt=True
    )["input_ids"]
    sampled = torch.randint(0, model.config.vocab_size, (8, mean_tokens), generator=torch.Generator().manual_seed(0))
    contexts = torch.cat([torch.tensor([prompt] * 8), sampled], dim=1).to(device)  # [8, P + mean_tokens]
    value_bias = model.model.layers[-1].self_attn.v_proj.bias  # [key-value heads x head size]
    with torch.no_grad():
        # a random direction, grown until the constant vector it adds sets every final state's direction
        bias = torch.randn(value_bias.shape, generator=torch.Generator().manual_seed(1)).to(device, value_bias.dtype)
        for scale in (1, 10, 100, 1000, 10_000):
            value_bias.copy_(bias * scale)
            hidden = model.model(contexts).last_hidden_state[:, len(prompt) - 1 :].flatten(0, 1).float()  # [N, d]
            direction = hidden.mean(0) / hidden.mean(0).norm()  # [d]
            if (hidden @ direction / hidden.norm(dim=-1)).min() > 0.999:
                break
        else:
            raise SystemExit("end_turns_after: the final hidden states did not align")
        weight = model.lm_head.weight.float()  # [V, d]
        logits = hidden @ weight.T  # [N, V]
        logits[:, end] = -torch.inf
        rest, along = logits.logsumexp(-1), hidden @ direction  # [N] each
        # the row's norm for which the end token's probability, averaged over positions, is 1 / mean_tokens
        norm = ((math.log(1 / (mean_tokens - 1)) + rest) / along).mean().item()
        model.lm_head.weight[end] = (norm * direction).to(model.lm_head.weight.dtype)
        ending = torch.sigmoid(norm * along - rest)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(
        f"end-of-turn row: value bias x {scale}, norm {norm:.3f}; the end token's probability a token "
        f"{ending.mean():.5f} (from {ending.min():.5f} to {ending.max():.5f})",
        flush=True,
    )
    del model
    torch.cuda.empty_cache()
    return out


def standalone_generate(model: Path, prompts: Path, config, threads: int | None) -> dict:
    """The rollout engine alone, in this process (with `threads` torch threads, else torch's default), on one GPU's
    share of the prompts (the first PROMPTS, read by the loop's own loader: the same ids and images) and the same
    settings; the second and third runs are timed."""
    if threads:
        torch.set_num_threads(threads)

    from oxrl_core.data.records import load_prompts
    from oxrl_core.models.tokenizer import load_tokenizer
    from oxrl_core.rollout.engine import RolloutEngine

    r = config.rollout
    examples = load_prompts(prompts, load_tokenizer(str(model))[0], r.max_prompt_len, strict=True)[0][:PROMPTS]
    ids, media = [x.prompt_ids for x in examples], [x.media for x in examples]
    engine = RolloutEngine(
        str(model), "bfloat16", r.max_prompt_len + r.max_tokens, r.gpu_memory_utilization, 0, len(ids) * r.n_samples
    )
    times = []
    for _ in range(3):
        start = time.perf_counter()
        rollouts = engine.generate(
            ids, r.n_samples, r.temperature, r.top_p, [r.max_tokens] * len(ids), list(range(len(ids))), media
        )
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times[1:])
    tokens = sum(len(x.response_ids) for x in rollouts)
    return {"threads": threads or torch.get_num_threads(), "generate_s": seconds, "tokens_per_s": tokens / seconds}


def prepare(
    out: Path, steps: int, shape: str, gpus: int = 1, tensor_parallel: int = 1, turns: int = 1, long_tail: bool = False
) -> tuple[Path, Path, Path]:
    """The model, the prompts and the run's config (`rl_step.yaml`) under `out`: PROMPTS prompts per GPU, each GPU a
    trainer rank and a worker of an engine of `tensor_parallel` GPUs (colocated). ZeRO-1 (one GPU's training phase is
    bound by the host, and stages 2 and 3 add host work); ZeRO-3 for the 32B shape, whose bf16 weights alone (61 GiB)
    and their gradients do not fit one GPU whole. Micro-batches of 32 sequences: the trainer's peak with them, 28.0 GB,
    stays under the 28.4 GB it reached at 16 before the fused head, and the training phase runs 3-5 points of MFU
    higher (benchmarks/RESULTS.md).

    The vision shape trains its 3.1B language-model weights (the vision tower frozen, oxrl's default) as a user of an
    80 GB GPU would: ZeRO-2 (on one GPU as ZeRO-1; on several, the float32 states sharded), recomputed activations
    and micro-batches of 16 (a VLM runs padded), and vLLM with 0.35 of the memory for all 512 sequences' KV cache.

    With `turns` above 1, each sample is an episode against the guess-the-number environment (its reward scores it)
    of at most `turns` messages of at most NEW_TOKENS tokens each, from `end_turns_after`'s model. `long_tail`: one
    response a sample, of geometric length with mean LONG_TAIL_MEAN tokens, cut at LONG_TAIL_CAP."""
    vision = shape in QWEN25_VL_SHAPES
    model = build_model(out / f"{shape}-shape", SHAPES[shape])
    prompts = write_prompts(model, out / "prompts.jsonl", PROMPTS * gpus, vision, as_text=turns > 1)
    episodes, reward, new_tokens = {}, "math", NEW_TOKENS
    if long_tail:
        model, new_tokens = end_turns_after(model, prompts, LONG_TAIL_MEAN), LONG_TAIL_CAP
    if turns > 1:
        model = end_turns_after(model, prompts, NEW_TOKENS // turns)
        # the environment's answers and the template between messages: a few dozen tokens a turn
        episodes = {
            "env": {"name": "guess-number", "max_turns": turns, "max_episode_tokens": turns * (NEW_TOKENS + 32)}
        }
        reward = "env"
    micro_batch = 16 if vision else 32
    config_path = out / "rl_step.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "model": {"name_or_path": str(model), "dtype": "bfloat16", "gradient_checkpointing": vision},
                "data": {"train": [{"path": str(prompts)}]},
                "train": {
                    "alg": "cispo",
                    "steps": steps,
                    "lr": 1e-6,
                    "lr_scheduler": "constant",
                    "batch_size": PROMPTS * SAMPLES * gpus,
                    "micro_batch_size": micro_batch,
                    "grad_accum": PROMPTS * SAMPLES // micro_batch,
                },
                "rollout": {
                    "n_samples": SAMPLES,
                    "temperature": 1.0,
                    "max_tokens": new_tokens,
                    "max_prompt_len": PROMPT_TOKENS + IMAGE_TOKENS * vision,
                    "gpu_memory_utilization": 0.35 if vision else 0.4,
                    "engines": gpus // tensor_parallel,
                    "tensor_parallel_size": tensor_parallel,
                    # `auto` would split a 1-GPU run over two GPUs on a larger host
                    "placement": "colocated",
                }
                | episodes,
                "reward": {"func": reward},
                "deepspeed": {"zero_stage": 3 if shape == "32b" else 2 if vision else 1},
                "run": {"name": "rl-step", "output_dir": str(out / "runs"), "train_ranks": gpus, "save_final": False},
            }
        )
    )
    return model, prompts, config_path


def workload_parser(doc: str, loop: str, steps: int, shapes: dict) -> argparse.ArgumentParser:
    """The arguments rl_step.py and sl_step.py share: where, how many steps, the model's shape, the GPUs, overrides."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--steps", type=int, default=steps, help=f"{loop} steps; the median of all but the first is reported"
    )
    parser.add_argument("--shape", choices=sorted(shapes), default="0.5b", help="the model's shape")
    parser.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="GPUs, each a trainer rank (and, in RL, an engine's worker) "
        "with PROMPTS x SAMPLES sequences of the step; MFU counts the peak of all of them",
    )
    parser.add_argument(
        "--save",
        action="store_true",
        help="keep the run folder with its final weights and checkpoint "
        "(default: nothing is saved, and the run folder goes once its logs are copied to --out/logs)",
    )
    parser.add_argument("overrides", nargs="*", help=f"KEY=VALUE config overrides, as for `oxrl train {loop.lower()}`")
    return parser


def keep_logs(run_dir: Path, out: Path, save: bool) -> None:
    """The run's logs into `out`/logs; the run folder itself removed unless `save` (a 7B's checkpoints fill a disk in a
    few runs)."""
    (out / "logs").mkdir(exist_ok=True)
    for log in (run_dir / "logs").glob("*.log"):
        shutil.copy(log, out / "logs" / log.name)
    if not save:
        shutil.rmtree(run_dir)


def main() -> None:
    parser = workload_parser(__doc__, "RL", steps=4, shapes=SHAPES)
    parser.add_argument(
        "--tensor-parallel",
        type=int,
        default=1,
        help="GPUs per vLLM engine (the 32B shape needs 4 or 8 "
        "on 80 GB GPUs); above 1, no standalone reference is run (it would need an engine of as many GPUs)",
    )
    parser.add_argument(
        "--no-standalone",
        action="store_true",
        help="skip the standalone engine's reference runs "
        "(three engine starts: minutes for a 7B model), as for a scaling curve, which compares the loop with itself",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=1,
        help="policy messages per episode at most (0.5B shape): each "
        "sample an episode against an environment, no standalone reference",
    )
    parser.add_argument(
        "--long-tail",
        action="store_true",
        help=f"long-tailed response lengths (0.5B and 7B shapes): geometric, "
        f"mean {LONG_TAIL_MEAN} tokens, cut at {LONG_TAIL_CAP}; no standalone reference",
    )
    parser.add_argument(
        "--slow-reward",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the math reward after this "
        "many seconds' wait per sample (benchmarks/slow_reward.py), as a sandbox or a remote judge",
    )
    args = parser.parse_args()
    if args.turns > 1 and args.shape != "0.5b":
        raise SystemExit(f"--turns runs on the 0.5B shape only, not --shape {args.shape}")
    if args.long_tail and args.shape not in (
        "0.5b",
        "7b",
    ):  # a text model, whose long tail a GPU-bound engine waits for
        raise SystemExit(f"--long-tail runs on the 0.5B and 7B shapes only, not --shape {args.shape}")
    if args.slow_reward:
        sys.path.insert(0, str(Path(__file__).parent))
        args.overrides = [
            "reward.func=slow_reward:math_after_delay",
            f"reward.kwargs={{delay_s: {args.slow_reward}}}",
            *args.overrides,
        ]
    args.out.mkdir(parents=True, exist_ok=True)
    model, prompts, config_path = prepare(
        args.out, args.steps, args.shape, args.gpus, args.tensor_parallel, args.turns, args.long_tail
    )
    run = resolve_run(
        "rl",
        config_path,
        ["run.name=rl-step-" + time.strftime("%H%M%S"), f"run.save_final={args.save}", *args.overrides],
    )
    config = run.config
    rollout, ranks = config.rollout, config.run.train_ranks
    engine_gpus = rollout.engines * rollout.tensor_parallel_size
    split = rollout.placement == "split"
    # the figures per GPU count every GPU once: colocated, a rank and an engine worker on each; split, either
    if not (ranks + engine_gpus == args.gpus if split else ranks == engine_gpus == args.gpus):
        raise SystemExit(
            f"run.train_ranks={ranks}, rollout.engines={rollout.engines} x rollout.tensor_parallel_size="
            f"{rollout.tensor_parallel_size}, rollout.placement={rollout.placement}: colocated, each must "
            f"cover --gpus={args.gpus} (set them with --gpus and --tensor-parallel); split (rollout.placement="
            f"split, with train.grad_accum for the fewer ranks), together"
        )

    def standalone_in_own_process(threads: int | None) -> dict:
        # run in this process after the loop, it once came out 1.6x slower than the loop's engine
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            result = pool.submit(standalone_generate, model, prompts, config, threads).result()
        print("standalone engine:", json.dumps(result), flush=True)  # in the log even if the run is cut short later
        return result

    # the standalone engine generates one GPU's share of the prompts: a colocated engine's
    reference = (
        rollout.tensor_parallel_size == 1
        and not args.no_standalone
        and not split
        and args.turns == 1
        and not args.long_tail
    )
    standalone = [standalone_in_own_process(threads) for threads in (None, 1)] if reference else []
    fastest = (
        max(standalone, key=lambda x: x["tokens_per_s"]) if reference else {"generate_s": None, "tokens_per_s": None}
    )
    with GpuMonitor() as memory:
        windows = watch_rollouts(memory)
        summary = train(run, resume=False, console=Console())
    keep_logs(Path(summary["run_dir"]), args.out, args.save)
    # The reference again, after the loop: does the host itself generate slower than before the run?
    standalone_after = standalone_in_own_process(1) if reference else {"tokens_per_s": None}
    history = summary["history"]
    timed = [key for key in history[-1] if key.startswith("time_") or key == "generate_tokens_per_s"]
    # the first step compiles and allocates; asynchronously, the first 1 + max_staleness steps find batches sampled
    # while step 1 trained (steps 2 .. 1 + s wait for nothing), and the last s find the engines draining (no later
    # batch shares them): the steps between show the steady state
    s = config.rollout.max_staleness
    measured = history[1 + s : len(history) - s] or history
    step = history[-1] | {key: statistics.median(h[key] for h in measured) for key in timed}
    # the tokens the policy sampled (an episode's response also holds the environment's), per second of generation
    policy_tokens = [
        h.get("policy_tokens", h["response_length"]) * config.train.batch_size / h["time_generate_s"] for h in measured
    ]
    step["generate_policy_tokens_per_s"] = statistics.median(policy_tokens)
    result = {
        "device": torch.cuda.get_device_name(0),
        "gpus": args.gpus,
        "overrides": args.overrides,
        **step,
        "per_step": [{key: h[key] for key in timed + MISMATCH if key in h} for h in history],
        "peak_gpu_memory_gb": memory.peak_gb,
    }
    result |= {
        "standalone": standalone,
        "standalone_generate_s": fastest["generate_s"],
        "standalone_tokens_per_s": fastest["tokens_per_s"],
        "standalone_after": standalone_after,
        "rollout_windows": windows,
    }

    n_params, n_vision = _parameter_count(model), _parameter_count(model, "visual.")
    n_text = n_params - n_vision
    shape = SHAPES[args.shape]
    text_shape = shape.get("text_config", shape)
    # a mixture of experts runs k of its E routed experts a token: its FLOPs count those (MFU on active parameters)
    n_experts = _parameter_count(model, ".mlp.experts.")
    if n_experts:
        n_text -= n_experts - n_experts * text_shape["num_experts_per_tok"] // text_shape["num_local_experts"]
    length = config.rollout.max_prompt_len + step["response_length"]  # every prompt is exactly max_prompt_len tokens
    tokens = config.train.batch_size * length
    phases = ("generate", "reward", "logprobs", "train", "refresh")
    step_s = step["time_step_s"]  # wall time: at rollout.lag > 0 generation overlaps the other phases
    # PaLM's MFU (arXiv 2204.02311, appendix B) also counts attention's QK^T and AV: 4 L d T FLOPs per token and
    # forward, over the full (unmasked) T x T as PaLM does
    attention = 4 * text_shape["num_hidden_layers"] * text_shape["hidden_size"] * length
    # The vision tower reads each sequence's image patches in every forward (2 FLOPs per weight and patch); frozen, it
    # has no backward. Counted per sequence, as the trainer runs it (vLLM encodes a prompt's image once for 8 samples).
    patches = config.train.batch_size * IMAGE_PATCHES * bool(n_vision)
    vision_train = 2 if config.model.freeze_vision else 6
    logprobs_flops = 2 * n_text * tokens + 2 * n_vision * patches
    train_flops = train_flops_per_token(config, n_text) * tokens + vision_train * n_vision * patches
    phase_s = step["time_train_s"] + step["time_logprobs_s"]
    gpus, peak = args.gpus, PEAK_FLOPS * ranks  # the training phase runs on the ranks' GPUs (split: not the engines')
    result |= {
        "params": n_params,
        "vision_params": n_vision,
        "active_text_params": n_text,  # the language model's, a mixture of experts' k of E experts among them
        "train_tokens": tokens,
        "step_s": step_s,
        "train_flops_per_token_per_param": train_flops_per_token(config, n_text) // n_text,
        "train_tokens_per_s": tokens / step["time_train_s"],
        "train_tokens_per_s_per_gpu": tokens / step["time_train_s"] / ranks,  # per trainer GPU
        "step_tokens_per_s_per_gpu": tokens
        / step_s
        / gpus,  # prompt + response tokens of the whole step: the scaling figure
        "generate_tokens_per_s_per_gpu": step["generate_tokens_per_s"] / gpus,
        "train_mfu": train_flops / step["time_train_s"] / peak,
        "logprobs_mfu": logprobs_flops / step["time_logprobs_s"] / peak,
        # a forward (logprobs) + forward/backward
        "training_phase_mfu": (logprobs_flops + train_flops) / phase_s / peak,
        "training_phase_mfu_with_attention": (logprobs_flops + train_flops + 4 * attention * tokens) / phase_s / peak,
        "refresh_share": step["time_refresh_s"] / step_s,
    }
    if reference:  # the standalone engine has one GPU's share of the prompts
        result |= {
            "rollout_vs_standalone": step["generate_tokens_per_s"] / gpus / result["standalone_tokens_per_s"],
            "rollout_vs_standalone_after": step["generate_tokens_per_s"] / gpus / standalone_after["tokens_per_s"],
        }
    if (
        args.shape == "0.5b" and gpus == 1 and not args.overrides and args.turns == 1
    ):  # the 0.5B step's targets, default config only
        result["targets_met"] = {
            "training_phase_mfu >= 0.40": result["training_phase_mfu"] >= 0.40,
            "rollout_vs_standalone >= 0.95": result["rollout_vs_standalone"] >= 0.95 if reference else None,
            "refresh_share <= 0.01": result["refresh_share"] <= 0.01,
            "trainer_peak_memory_gb <= 28.4": result["trainer_peak_memory_gb"] <= 28.4,
        }
    (args.out / "rl_step.json").write_text(json.dumps(result, indent=2))
    console = Console()
    for p in phases:
        console.print(f"{p:10s} {step[f'time_{p}_s']:8.3f} s  ({step[f'time_{p}_s'] / step_s:6.1%})")
    for key in (
        "step_s",
        "generate_tokens_per_s",
        "generate_policy_tokens_per_s",
        "turns",
        "policy_tokens",
        "response_length",
        "standalone_tokens_per_s",
        "rollout_vs_standalone",
        "train_tokens_per_s",
        "rollout_vs_standalone_after",
        "train_tokens_per_s_per_gpu",
        "step_tokens_per_s_per_gpu",
        "train_mfu",
        "logprobs_mfu",
        "training_phase_mfu",
        "training_phase_mfu_with_attention",
        "refresh_share",
        "trainer_peak_memory_gb",
        "peak_gpu_memory_gb",
    ):
        value = result.get(key)
        value = float("nan") if value is None else value
        console.print(f"{key:26s} {value:,.3f}" if isinstance(value, float) else f"{key:26s} {value:,}")
    for target, met in result.get("targets_met", {}).items():
        console.print(f"target {target}: {'not run' if met is None else 'met' if met else 'NOT met'}")


def train_flops_per_token(config, n_params: int) -> int:
    """Forward 2N, backward 2N for the activations' gradients and, without LoRA, 2N for the weights' (LoRA's own
    weights are negligible beside them)."""
    return (4 if config.lora.enabled else 6) * n_params


def _parameter_count(folder: Path, part: str = "") -> int:
    """From the safetensors headers (a 7B model comes in several files), loading nothing; with `part`, of the weights
    whose names hold it."""
    from safetensors import safe_open

    count = 0
    for path in folder.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            count += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys() if part in name)
    return count


if __name__ == "__main__":
    main()
