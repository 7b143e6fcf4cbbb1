"""The code reward: run a candidate program against its tests in a separate, limited process.

Limits: wall time (the process group is killed), CPU time, address space and
file size (rlimits); its own temporary directory as working directory and
HOME; no network (a fresh network namespace via `unshare -rn` where the
kernel allows it); and a Python audit hook that refuses writes outside the
temporary directory, new processes, sockets and ctypes. This stops model
mistakes (loops, stray writes, downloads); it is not a jail for hostile code.
"""

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)

# Runs first in the child: install the audit hook, then execute the program.
GUARD = r'''
import os, sys
ROOT = os.path.realpath(sys.argv[1])
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
PATH_EVENTS = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1, "os.utime": 1,
               "os.truncate": 1, "shutil.rmtree": 1, "os.rename": 2, "os.replace": 2, "os.link": 2, "os.symlink": 2}
REFUSED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
           "ctypes.", "os.kill", "os.killpg")

def inside(path):
    if isinstance(path, int):
        return True  # an already-open descriptor
    real = os.path.realpath(os.fsdecode(path))
    return real == ROOT or real.startswith(ROOT + os.sep)

def guard(event, args):
    if event == "open":
        path, mode, flags = args
        writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (flags or 0) & WRITE_FLAGS
        if writing and path is not None and not inside(path):
            raise PermissionError(f"sandbox: writing outside its directory: {path}")
    elif event in PATH_EVENTS:
        for path in args[:PATH_EVENTS[event]]:
            if not inside(path):
                raise PermissionError(f"sandbox: {event} outside its directory: {path}")
    elif event.startswith(REFUSED):
        raise PermissionError(f"sandbox: {event} is not allowed")

program = open(sys.argv[2]).read()
sys.addaudithook(guard)
exec(compile(program, "solution.py", "exec"), {"__name__": "__main__"})
'''


@dataclass
class SandboxResult:
    passed: bool
    reason: str  # "ok", "timeout", "error", ...
    output: str


def extract_code(response: str) -> str:
    """The last fenced code block, else the whole response."""
    blocks = CODE_BLOCK.findall(response)
    return blocks[-1] if blocks else response


def run_sandboxed(program: str, timeout_s: float = 5.0, memory_mb: int = 512) -> SandboxResult:
    with tempfile.TemporaryDirectory(prefix="oxrl-code-") as work:
        work_dir = Path(work)
        (work_dir / "guard.py").write_text(GUARD)
        (work_dir / "solution.py").write_text(program)
        command = [sys.executable, "-I", "-B", str(work_dir / "guard.py"), str(work_dir), str(work_dir / "solution.py")]
        if _can_unshare_network():
            command = ["unshare", "-rn", *command]

        def limit() -> None:  # in the child, before exec
            os.setsid()
            memory = memory_mb * 1024**2
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            resource.setrlimit(resource.RLIMIT_CPU, (int(timeout_s) + 1, int(timeout_s) + 1))
            resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024**2, 16 * 1024**2))

        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work, "TMPDIR": work, "PYTHONHASHSEED": "0"}
        process = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, preexec_fn=limit, text=True)
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            return SandboxResult(False, "timeout", output[-2000:])
    if process.returncode == 0:
        return SandboxResult(True, "ok", output[-2000:])
    return SandboxResult(False, "error", output[-2000:])


@cache
def _can_unshare_network() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0


def code_reward(response: str, sample: dict, timeout_s: float = 5.0, memory_mb: int = 512) -> float:
    """1 when the response's code passes `sample["tests"]` (Python asserts, a string or a list), else 0."""
    tests = sample["tests"]
    tests = "\n".join(tests) if isinstance(tests, list) else str(tests)
    return float(run_sandboxed(f"{extract_code(response)}\n\n{tests}\n", timeout_s, memory_mb).passed)
