"""Merging a LoRA adapter into its base model: plain safetensors that transformers and vLLM load.

LoRA (Hu et al. 2021, arXiv 2106.09685) trains `W' = W + (alpha / r) B A` with the base
weight W frozen; merging computes W' once, so the model runs with no adapter machinery.
The merge itself is peft's (`PeftModel.merge_and_unload`). Around it: the adapter must
fit the base (checked on a meta-device copy, before any weight is read), the merged
logits must equal those of the base with the adapter applied, and the output folder
appears whole or not at all (written beside it, renamed at the end).
"""

import copy
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from oxrl_core.errors import OxrlError
from oxrl_core.models.hub import is_multimodal_config, resolve_model
from oxrl_core.models.names import restore_checkpoint_names
from oxrl_core.models.tokenizer import load_tokenizer

# peft task type -> the transformers class that the base loads as
MODEL_CLASSES = {"CAUSAL_LM": "AutoModelForCausalLM", "SEQ_CLS": "AutoModelForSequenceClassification"}
DTYPES = ("auto", "float32", "bfloat16", "float16")
PEFT_NAME_PARTS = ("base_model.model.", ".base_layer.", "lora_", "modules_to_save")  # none may survive the merge
SHARD_SIZE = re.compile(r"\d+\s*[KMGT]B", re.IGNORECASE)  # what save_pretrained's max_shard_size parses
CHECK_TEXTS = ("The quick brown fox jumps over the lazy dog.", "What is 17 + 25? Answer in one line.")


@dataclass
class MergeReport:
    adapter: Path
    base: str  # the folder or Hub id the base loaded from
    task_type: str  # CAUSAL_LM or SEQ_CLS
    lora_layers: int  # layers whose weight took a LoRA delta
    dtype: str  # of the written weights
    max_logit_diff: float | None  # merged vs adapter-applied logits, float32; None with check=False
    tokenizer_from: str
    out: Path
    files: list[str]  # what the output folder holds


def merge_adapter(
    adapter: Path,
    out: Path,
    base: str | None = None,
    dtype: str = "auto",
    max_shard_size: str = "2GB",
    atol: float = 1e-4,
    check: bool = True,
) -> MergeReport:
    """Merge the LoRA adapter folder `adapter` into its base and write the merged model to `out`.

    `base` defaults to the adapter's recorded `base_model_name_or_path`. The base loads in
    float32 (4 bytes per parameter of memory), so that the merge adds the delta without
    rounding and the check compares in float32; the weights are cast to `dtype` (auto: the
    base's own) only when written. With `check`, the merged model's logits on a few fixed
    token sequences must be within `atol` of the adapter-applied model's.
    """
    import transformers
    from peft import PeftModel

    adapter, out = Path(adapter), Path(out)
    if dtype not in DTYPES:
        raise OxrlError(f"--dtype {dtype!r}: not a dtype oxrl writes; allowed: {', '.join(DTYPES)}")
    if not SHARD_SIZE.fullmatch(max_shard_size):
        raise OxrlError(
            f"--max-shard-size {max_shard_size!r}: not a size; give a whole number and a unit, e.g. 2GB or 500MB"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OxrlError(f"--out {out}: already exists and is not an empty folder; choose a new folder")
    peft_config, weights = _read_adapter(adapter)
    task_type = peft_config.task_type or "CAUSAL_LM"  # adapters saved without one wrap a plain causal LM
    if task_type not in MODEL_CLASSES:
        raise OxrlError(
            f"{adapter}: adapter task_type {task_type!r} cannot be merged by oxrl; allowed: {', '.join(MODEL_CLASSES)}"
        )
    base_path = _resolve_base(adapter, base, peft_config.base_model_name_or_path)
    tokenizer_from = str(adapter) if _has_tokenizer(adapter) else base_path
    tokenizer, pad_id = load_tokenizer(tokenizer_from)
    head = _head_config(adapter, weights, pad_id) if task_type == "SEQ_CLS" else {}
    base_config = transformers.AutoConfig.from_pretrained(base_path, **head)
    multimodal = is_multimodal_config(base_config)  # a model that reads images or audio, its processor kept
    model_class = (
        transformers.AutoModelForMultimodalLM if multimodal else getattr(transformers, MODEL_CLASSES[task_type])
    )
    if base is not None:
        _check_same_architecture(adapter, base_path, base_config, peft_config.base_model_name_or_path)
    _check_adapter_fits(adapter, peft_config, weights, model_class, base_config, base_path)
    out_dtype = (base_config.dtype or torch.float32) if dtype == "auto" else getattr(torch, dtype)

    model = PeftModel.from_pretrained(
        model_class.from_pretrained(base_path, config=base_config, dtype=torch.float32), adapter
    ).eval()
    inputs = _check_inputs(tokenizer) if check else []
    with torch.no_grad():
        applied = [model(input_ids=ids).logits.float() for ids in inputs]  # [1, T, vocab] (SEQ_CLS: [1, num_labels])
        merged = model.merge_and_unload()
        diff = max(
            ((merged(input_ids=ids).logits.float() - ref).abs().max().item() for ids, ref in zip(inputs, applied)),
            default=None,
        )
    if diff is not None and diff > atol:
        raise OxrlError(
            f"{adapter}: merged logits differ from the adapter-applied ones by {diff:.3g} > --atol {atol:g}; nothing written"
        )
    processor = transformers.AutoProcessor.from_pretrained(tokenizer_from) if multimodal else tokenizer
    files = _write_atomically(out, merged.to(out_dtype), processor, max_shard_size)
    return MergeReport(
        adapter,
        base_path,
        task_type,
        sum(".lora_A." in n or "lora_embedding_A" in n for n in weights),
        str(out_dtype).removeprefix("torch."),
        diff,
        tokenizer_from,
        out,
        files,
    )


def _read_adapter(adapter: Path):
    """The adapter's LoraConfig and its tensors (under peft's saved names), or a clear error."""
    from peft import PeftConfig
    from peft.utils import load_peft_weights

    if not adapter.is_dir():
        raise OxrlError(
            f"{adapter}: no such folder; give a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)"
        )
    if not (adapter / "adapter_config.json").is_file():
        found = (
            "a full model (config.json), not an adapter"
            if (adapter / "config.json").is_file()
            else "no adapter_config.json"
        )
        raise OxrlError(
            f"{adapter}: not a PEFT adapter folder ({found}); give the folder a LoRA run saved (e.g. <run>/final)"
        )
    if not any((adapter / f).is_file() for f in ("adapter_model.safetensors", "adapter_model.bin")):
        raise OxrlError(
            f"{adapter}: adapter_config.json but no adapter_model.safetensors (or .bin); the adapter is incomplete"
        )
    try:
        peft_config = PeftConfig.from_pretrained(adapter)
    except (ValueError, TypeError) as e:  # not JSON, or fields peft does not know
        raise OxrlError(
            f"{adapter}/adapter_config.json: not a PEFT adapter config ({str(e).splitlines()[0][:160]})"
        ) from None
    if peft_config.peft_type != "LORA":
        raise OxrlError(
            f"{adapter}: peft_type {peft_config.peft_type.value!r} is not LoRA; oxrl merges LORA adapters only"
        )
    return peft_config, load_peft_weights(str(adapter), device="cpu")


def _resolve_base(adapter: Path, base: str | None, recorded: str | None) -> str:
    if base is None and not recorded:
        raise OxrlError(f"{adapter}: adapter_config.json records no base_model_name_or_path; pass --base")
    try:
        return resolve_model(base if base is not None else recorded)
    except OxrlError as e:
        where = (
            "--base"
            if base is not None
            else f"{adapter}/adapter_config.json's base_model_name_or_path (pass --base to use another)"
        )
        raise OxrlError(f"base model from {where}: {e}") from None


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file()


def _check_same_architecture(adapter: Path, base_path: str, base_config, recorded: str | None) -> None:
    """--base must be the kind of model the adapter was trained on, when the recorded base can be read."""
    from transformers import AutoConfig

    if not recorded or recorded == base_path:
        return
    try:
        trained = AutoConfig.from_pretrained(recorded, local_files_only=True)
    except (OSError, ValueError):
        return  # the recorded base is gone or was never local: the shape check below still runs
    kinds = [(c.model_type, c.architectures) for c in (trained, base_config)]
    if kinds[0] != kinds[1]:
        raise OxrlError(
            f"--base {base_path}: model_type {kinds[1][0]!r} {kinds[1][1]}, but {adapter} was trained on {recorded}: "
            f"model_type {kinds[0][0]!r} {kinds[0][1]}; give a base of the same architecture"
        )


def _head_config(adapter: Path, weights: dict, pad_id: int) -> dict:
    """A SEQ_CLS adapter saves its classification head whole; the base gets a head of that size (config overrides)."""
    heads = [
        t
        for name, t in weights.items()
        if name.removeprefix("base_model.model.") in ("score.weight", "classifier.weight")
    ]
    if not heads:
        raise OxrlError(
            f"{adapter}: task_type SEQ_CLS but the adapter holds no score/classifier head; nothing to merge it into"
        )
    return {"num_labels": heads[0].shape[0], "pad_token_id": pad_id}


def _check_adapter_fits(adapter: Path, peft_config, weights: dict, model_class, base_config, base_path: str) -> None:
    """Every adapter tensor must have a place of the same shape in the base wrapped by peft.

    peft wraps a meta-device copy of the base (module tree and shapes, no weights) and names
    the tensors it would save; the adapter's must be among them, shape for shape.
    """
    from peft import get_peft_model
    from peft.utils import get_peft_model_state_dict

    what = f"base {base_path} (model_type {base_config.model_type!r})"
    with torch.device("meta"):
        skeleton = model_class.from_config(base_config)
    try:
        wrapped = get_peft_model(skeleton, copy.deepcopy(peft_config), low_cpu_mem_usage=True)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model ..."
        raise OxrlError(
            f"{adapter}: its target modules {sorted(peft_config.target_modules or [])} do not fit {what}: "
            f"{str(e).splitlines()[0]}; give the base the adapter was trained on"
        ) from None
    expected = get_peft_model_state_dict(
        wrapped, save_embedding_layers=True
    )  # with the embeddings: a resized vocabulary shows
    for name, tensor in weights.items():
        if name not in expected:
            raise OxrlError(
                f"{adapter}: adapter tensor {name} has no counterpart in {what}; give the base the adapter was trained on"
            )
        if expected[name].shape != tensor.shape:
            raise OxrlError(
                f"{adapter}: adapter tensor {name} has shape {list(tensor.shape)}, {what} needs {list(expected[name].shape)}: "
                "the adapter was trained on a model of another size; give the base it was trained on"
            )


def _check_inputs(tokenizer) -> list[torch.Tensor]:
    """Fixed token sequences ([1, T] each): plain text, and a user turn through the chat template when there is one."""
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in CHECK_TEXTS]
    if tokenizer.chat_template:
        ids.append(
            tokenizer.apply_chat_template([{"role": "user", "content": CHECK_TEXTS[1]}], add_generation_prompt=True)[
                "input_ids"
            ]
        )
    return [torch.tensor([x]) for x in ids]


def _write_atomically(out: Path, model, processor, max_shard_size: str) -> list[str]:
    """Write into a hidden sibling of `out`, then rename it into place: `out` is whole or absent."""
    from safetensors import safe_open

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(staging, max_shard_size=max_shard_size)
        restore_checkpoint_names(staging, model.config.model_type)
        processor.save_pretrained(staging)  # the tokenizer, or a multimodal model's whole processor
        for shard in staging.glob("*.safetensors"):
            with safe_open(shard, "pt") as f:
                leftover = [k for k in f.keys() if any(part in k for part in PEFT_NAME_PARTS)]
            if leftover:  # peft's merge_and_unload promises plain names; vLLM would refuse these
                raise RuntimeError(f"{shard.name}: peft names survived the merge: {leftover[:3]}")
        staging.chmod(0o755)  # mkdtemp makes it private; the result is read like any model folder
        os.replace(staging, out)  # an empty `out` is replaced; a non-empty one (made meanwhile) raises
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(p.name for p in out.iterdir())
