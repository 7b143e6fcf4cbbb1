"""`oxrl onboard`: scout a model, write its registry entry and configs, optionally verify it; `--list` the registry."""

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from oxrl_core.errors import OxrlError


def onboard(
    model: str = typer.Argument(
        None, help="A Hugging Face Hub id (org/name) or a local model folder.", show_default=False
    ),
    out: Path = typer.Option(
        Path("registry"), "--out", help="Where the entry (<org>--<name>.yaml) and its configs go."
    ),
    verify: bool = typer.Option(
        False, "--verify", help="Run one SFT step and one RL step on the model and record it as verified."
    ),
    full_weights: bool = typer.Option(
        False, "--full-weights", help="With --verify: the RL steps train every weight, not LoRA on the entry's targets."
    ),
    mark_registry: Path = typer.Option(
        None,
        "--mark-registry",
        help="With --verify: once it passes, also mark every entry in this folder of the same architecture verified "
        "(the shipped registry is kept so, from each family's tiny model).",
    ),
    trust_remote_code: bool = typer.Option(
        False, "--trust-remote-code", help="Run model code shipped with the repository (off unless you trust it)."
    ),
    list_: bool = typer.Option(
        False, "--list", help="Print the registry (shipped entries and those in --out) and exit."
    ),
) -> None:
    """Scout a model (config and tokenizer only, never the weights), write its registry entry and SFT/RL configs."""
    from oxrl_core.model_registry.schema import entry_file_name, mark_verified, registry_entries, write_entry

    console = Console()
    if list_:
        _render_registry(registry_entries(out), console)
        return
    if model is None:
        raise OxrlError("oxrl onboard: give a Hub id (org/name) or a model folder, or --list")
    if full_weights and not verify:
        raise OxrlError("--full-weights: only with --verify (it says which weights the verify's RL steps train)")
    if mark_registry is not None and not (verify and mark_registry.is_dir()):
        raise OxrlError(f"--mark-registry {mark_registry}: needs --verify and an existing folder of registry entries")
    from oxrl_core.model_registry.configs import write_configs
    from oxrl_core.model_registry.scout import scout

    report = scout(model, trust_remote_code)
    _render_report(report, console)
    if report.stops:
        raise OxrlError(f"{model}: not onboarded: {'; '.join(report.stops)}")
    entry = report.entry
    if verify and not entry.oxrl_trainable:
        raise OxrlError(
            f"--verify: oxrl cannot train {model} (model_type {entry.model_type!r}), so there is nothing to verify"
        )
    configs = (
        write_configs(entry, trust_remote_code, out / entry_file_name(entry.model).removesuffix(".yaml"))
        if entry.oxrl_trainable
        else ()
    )
    entry_path = write_entry(entry, out)
    if verify:
        from oxrl_core.model_registry.verify import verify as verify_steps

        entry = verify_steps(entry, *configs, console, full_weights)
        entry_path = write_entry(entry, out)
        if mark_registry is not None:
            for path in mark_verified(entry, mark_registry):
                console.print(f"marked verified: {path}", soft_wrap=True, highlight=False, markup=False)
    written = [f"entry {entry_path} ({entry.status})", *(f"config {path}" for path in configs)]
    console.print("\n".join(written), soft_wrap=True, highlight=False, markup=False)  # paths print verbatim


def _render_report(report, console: Console) -> None:
    from oxrl_core.model_registry.scout import full_finetune_gb

    e = report.entry
    table = Table(title=f"oxrl onboard: {e.model}", show_header=False)
    params = _count(e.params) + (f" ({_count(e.active_params)} active)" if e.active_params else "")
    rows = [
        ("files read", str(report.folder)),
        ("architecture", f"{e.architecture} ({e.model_type})"),
        ("model class", e.model_class),
        ("parameters", params),
        ("context length", f"{e.context_length:,}"),
        ("dtype", e.dtype),
        ("vocabulary", f"{e.vocab_size:,}"),
        ("special tokens", ", ".join(f"{k} {v!r}" for k, v in report.special_tokens.items()) or "none"),
        (
            "chat template",
            "renders user/assistant with a generation prompt"
            if report.rendered_chat
            else "present, does not render"
            if e.chat_template
            else "none",
        ),
        (f"vLLM {report.vllm_version}", "supports it" if report.vllm_supported else "does not support it"),
        ("oxrl trainer", "loads it" if e.oxrl_trainable else "cannot load it"),
        (
            "recommended",
            f"{'full fine-tuning' if e.recommended_mode == 'full' else 'LoRA'}: full needs ~{full_finetune_gb(e.params):.3g} GB "
            f"(16 B/param x 1.2) for {report.gpu_note}",
        ),
        ("LoRA targets", ", ".join(e.lora_targets)),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if report.rendered_chat:
        console.print("sample conversation through the chat template:", highlight=False)
        console.print(report.rendered_chat, soft_wrap=True, highlight=False, markup=False)
    for finding in report.findings:
        console.print(f"[{'red' if finding.level == 'stop' else 'yellow'}]{finding.level}:[/] ", end="")
        console.print(finding.text, soft_wrap=True, highlight=False, markup=False)


def _render_registry(entries: list, console: Console) -> None:
    table = Table(
        title="oxrl model registry",
        caption="mode: full fine-tuning or LoRA by the 16 B/param rule, for the GPU memory "
        "in each entry (shipped entries: one 80 GB GPU)",
    )
    table.add_column("model", no_wrap=True)
    for column in ("class", "params", "active", "context", "mode", "oxrl trains", "status"):
        table.add_column(column)
    for e in sorted(entries, key=lambda e: e.model.lower()):
        status = f"verified {e.verified_date}" if e.status == "verified" else e.status
        table.add_row(
            e.model,
            e.model_class,
            _count(e.params),
            _count(e.active_params) if e.active_params else "-",
            f"{e.context_length:,}",
            e.recommended_mode,
            "yes" if e.oxrl_trainable else "no",
            status,
        )
    console.print(table)
    console.print(f"{len(entries)} models", highlight=False)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
