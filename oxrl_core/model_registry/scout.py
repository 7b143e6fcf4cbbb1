"""The model scout: read a model's config, generation config and tokenizer (never its
weights) and say what it is and whether oxrl can train it.

Parameters are counted on a model built on the meta device from the config alone.
The full-vs-LoRA rule (`recommend_mode`): full fine-tuning with AdamW in mixed
precision holds about 16 bytes per parameter (bf16 weights and gradients, fp32
master weights and two Adam moments), plus about 20% for activations and buffers;
full is recommended when 16 x params x 1.2 fits in the GPU memory of all GPUs together
(ZeRO-3 shards all of it), LoRA otherwise. Without a GPU the rule is applied to an
assumed single 80 GB GPU.
"""

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

import torch

from oxrl_core.data.media import MEDIA_MODEL_TYPES
from oxrl_core.data.sft import tokenize_sft
from oxrl_core.errors import OxrlError
from oxrl_core.model_registry.schema import RegistryEntry
from oxrl_core.models.hub import meta_model
from oxrl_core.models.tiny import TINY_MODELS, resolve_tiny_model

FULL_BYTES_PER_PARAM = 16
ACTIVATION_OVERHEAD = 1.2
ASSUMED_GPU_MEMORY_GB = 80
# What scouting a Hub model downloads: configs and tokenizer files, never weights.
HUB_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "vocab*",
    "merges.txt",
    "*.tiktoken",
    "tokenizer.model",
    "chat_template.*",
    "preprocessor_config.json",
    "processor_config.json",
]
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
# Module-name parts of what is not the language model's attention and MLP blocks.
NOT_LORA_TARGETS = ("lm_head", "embed", "visual", "vision", "audio", "multi_modal_projector", "connector")
SAMPLE_CONVERSATION = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "<answer>5</answer>"},
]


@dataclass
class Finding:
    level: Literal["warn", "stop"]  # stop: training cannot work until it is fixed
    text: str


@dataclass
class ScoutReport:
    entry: RegistryEntry
    folder: Path  # where the files were read
    special_tokens: dict[str, str]
    rendered_chat: str | None  # the sample conversation through the chat template
    vllm_supported: bool
    vllm_version: str
    gpu_note: str  # the GPU memory the recommendation was made for, in words
    findings: list[Finding] = field(default_factory=list)

    @property
    def stops(self) -> list[str]:
        return [f.text for f in self.findings if f.level == "stop"]


def recommend_mode(params: int, gpu_memory_gb: float) -> Literal["full", "lora"]:
    return "full" if full_finetune_gb(params) <= gpu_memory_gb else "lora"


def full_finetune_gb(params: int) -> float:
    return FULL_BYTES_PER_PARAM * params * ACTIVATION_OVERHEAD / 1e9


def scout(model: str, trust_remote_code: bool = False) -> ScoutReport:
    """Everything `oxrl onboard` reports about `model` (a folder or a Hub id); OxrlError if it cannot be read."""
    folder, name = _locate(model)
    config = _read_config(folder, trust_remote_code)
    facts = _model_facts(config, str(folder), trust_remote_code)
    tokenizer = _read_tokenizer(folder, trust_remote_code)
    eos_ids = _generation_eos_ids(folder, config)
    findings = _eos_findings(tokenizer, eos_ids)
    template_findings, rendered = _chat_findings(tokenizer, eos_ids | {tokenizer.eos_token_id} - {None})
    findings += template_findings
    text_config = config.get_text_config()
    if len(tokenizer) > text_config.vocab_size:
        findings.append(
            Finding(
                "stop",
                f"the tokenizer has {len(tokenizer)} tokens but the model embeds only vocab_size={text_config.vocab_size}",
            )
        )
    vllm_version, vllm_archs = _vllm_architectures()
    vllm_supported = facts["architecture"] in vllm_archs
    if not vllm_supported:
        findings.append(
            Finding(
                "warn",
                f"vLLM {vllm_version} does not support {facts['architecture']}: RL rollouts need it (SFT works without)",
            )
        )
    if not facts["oxrl_trainable"]:
        findings.append(
            Finding(
                "warn",
                f"oxrl trains causal LMs (AutoModelForCausalLM, which has no class for model_type "
                f"{config.model_type!r}) and the multimodal models {', '.join(MEDIA_MODEL_TYPES)}: "
                "the entry is written, no training configs",
            )
        )
    gpu_memory_gb, gpu_note = _gpu_memory()
    entry = RegistryEntry(
        model=name,
        **facts,
        chat_template=bool(tokenizer.chat_template),
        recommended_mode=recommend_mode(facts["params"], gpu_memory_gb),
        gpu_memory_gb=gpu_memory_gb,
    )
    special = {
        k: v
        for k, v in (
            ("bos", tokenizer.bos_token),
            ("eos", tokenizer.eos_token),
            ("pad", tokenizer.pad_token),
            ("unk", tokenizer.unk_token),
        )
        if v is not None
    }
    return ScoutReport(entry, folder, special, rendered, vllm_supported, vllm_version, gpu_note, findings)


def _locate(model: str) -> tuple[Path, str]:
    """(a folder holding the model's config files, the name the entry records)."""
    if model in TINY_MODELS:  # a family's tiny model, built here on first use
        return resolve_tiny_model(model), model
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise OxrlError(f"{model}: folder has no config.json; expected a Hugging Face model folder")
        return path, str(path.resolve())
    if not HUB_ID.match(model):
        raise OxrlError(f"{model}: not a folder and not a Hub id (org/name)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(model, allow_patterns=HUB_FILES)), model
    except LocalEntryNotFoundError:
        raise OxrlError(
            f"{model}: not in the Hugging Face cache, and the Hub cannot be reached (offline: HF_HUB_OFFLINE is set "
            "or no network); download it once online or give a local folder"
        ) from None
    except HfHubHTTPError as e:
        raise OxrlError(
            f"{model}: the Hub refused it ({str(e).splitlines()[0]}); check the id, and HF_TOKEN for gated models"
        ) from None


def _read_config(folder: Path, trust_remote_code: bool):
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except OSError as e:
        raise OxrlError(f"{folder}/config.json: {str(e).splitlines()[0]}") from None
    except (ValueError, KeyError) as e:
        hint = (
            ""
            if trust_remote_code
            else "; if the repository ships its own model code, pass --trust-remote-code (it runs that code)"
        )
        raise OxrlError(
            f"{folder}/config.json: transformers cannot build this model ({str(e).splitlines()[0]}){hint}"
        ) from None
    if not config.architectures:
        raise OxrlError(
            f"{folder}/config.json: no `architectures` entry; it names the model class the checkpoint was saved from"
        )
    return config


def _model_facts(config, folder: str, trust_remote_code: bool) -> dict:
    """The entry's fields that come from config.json and the module tree built from it."""
    from transformers import AutoModelForMultimodalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_class = (
        "image-text-to-text"
        if hasattr(config, "vision_config")
        else "audio-text-to-text"
        if hasattr(config, "audio_config")
        else "causal-lm"
    )
    try:
        if model_class == "causal-lm":
            model = meta_model(folder, trust_remote_code)
        else:
            with torch.device("meta"):
                model = AutoModelForMultimodalLM.from_config(config, trust_remote_code=trust_remote_code)
    except ValueError as e:  # the model's code refuses the config
        raise OxrlError(
            f"{folder}/config.json: transformers cannot build {config.architectures[0]} from it ({str(e).splitlines()[0]})"
        ) from None
    text_config = config.get_text_config()
    params = sum(p.numel() for p in model.parameters())
    dtype = getattr(config, "dtype", None) or text_config.dtype
    return {
        "architecture": config.architectures[0],
        "model_type": config.model_type,
        "model_class": model_class,
        "params": params,
        "active_params": _active_params(model, text_config, params),
        "context_length": text_config.max_position_embeddings,
        "dtype": str(dtype or "float32").removeprefix("torch."),
        "vocab_size": text_config.vocab_size,
        "oxrl_trainable": config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        or config.model_type in MEDIA_MODEL_TYPES
        or "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {}),
        "lora_targets": _lora_targets(model),
    }


def _active_params(model: torch.nn.Module, text_config, params: int) -> int | None:
    """Parameters one token passes through (embeddings and any vision tower included): all but the unrouted experts."""
    experts = next(
        (
            getattr(text_config, k)
            for k in ("num_experts", "num_local_experts", "n_routed_experts")
            if getattr(text_config, k, None)
        ),
        None,
    )
    if experts is None:
        return None
    expert_params = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    return params - expert_params + expert_params * text_config.num_experts_per_tok // experts


def _lora_targets(model: torch.nn.Module) -> list[str]:
    """Suffixes of the linear layers in the language model's blocks, in model order; no routers or gates."""
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    suffixes = [name.rsplit(".", 1)[-1] for name in names if not any(part in name for part in NOT_LORA_TARGETS)]
    return list(dict.fromkeys(s for s in suffixes if not s.endswith("gate")))


def _read_tokenizer(folder: Path, trust_remote_code: bool):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as e:
        raise OxrlError(f"{folder}: no usable tokenizer ({str(e).splitlines()[0][:200]})") from None


def _generation_eos_ids(folder: Path, config) -> set[int]:
    """The ids generation stops on: generation_config.json's eos_token_id (vLLM reads it), else config.json's."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(folder).eos_token_id
    except OSError:  # no generation_config.json
        eos = config.get_text_config().eos_token_id
    return set(eos if isinstance(eos, list) else [eos] if eos is not None else [])


def _eos_findings(tokenizer, eos_ids: set[int]) -> list[Finding]:
    if tokenizer.eos_token is None:
        return [
            Finding(
                "stop",
                "the tokenizer has no EOS token (eos_token in tokenizer_config.json): "
                "generation would not stop and SFT could not teach the model to stop",
            )
        ]
    if eos_ids and tokenizer.eos_token_id not in eos_ids:
        return [
            Finding(
                "warn",
                f"EOS mismatch: the tokenizer's EOS {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}) is not "
                f"among the ids generation stops on, {sorted(eos_ids)} (generation_config.json, else config.json)",
            )
        ]
    return []


def _chat_findings(tokenizer, stop_ids: set[int]) -> tuple[list[Finding], str | None]:
    """Problems with the chat template as SFT uses it, and the sample conversation as it renders it."""
    if not tokenizer.chat_template:
        return [
            Finding(
                "stop",
                "no chat template (chat_template in tokenizer_config.json or chat_template.jinja): "
                "SFT and RL render every record with it; use an instruct model or add one",
            )
        ], None
    try:
        example = tokenize_sft(SAMPLE_CONVERSATION, tokenizer, max_len=10**6)
    except ValueError as e:  # the same checks SFT data loading makes
        return [Finding("stop", f"chat template: {e}")], None
    response = {t for t, m in zip(example.input_ids, example.target_mask) if m}
    findings = []
    if stop_ids and not stop_ids & response:
        findings.append(
            Finding(
                "warn",
                f"the chat template ends the assistant turn with none of the stop ids {sorted(stop_ids)}: "
                "the model may not learn to stop",
            )
        )
    return findings, tokenizer.apply_chat_template(SAMPLE_CONVERSATION, tokenize=False)


@cache
def _vllm_architectures() -> tuple[str, frozenset[str]]:
    """(the installed vLLM's version, the architectures it runs); importing vLLM takes seconds, so once."""
    import vllm
    from vllm.model_executor.models import ModelRegistry

    return vllm.__version__, frozenset(ModelRegistry.get_supported_archs())


def _gpu_memory() -> tuple[int, str]:
    """(GB of memory on all GPUs here, or the assumed one GPU without any, and that in words)."""
    if not torch.cuda.is_available():
        return ASSUMED_GPU_MEMORY_GB, f"no GPU here: assumes one {ASSUMED_GPU_MEMORY_GB} GB GPU"
    total = round(sum(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())) / 1e9)
    return total, f"{torch.cuda.device_count()} GPU(s) here, {total} GB in all"
