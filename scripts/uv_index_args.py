"""Print, one per line, the uv arguments that give it the package sources pip is configured with on this machine
(pip.conf files and PIP_* variables, as `pip config list` shows them): a mirror, extra indexes, find-links folders
and constraint files. uv reads none of pip's configuration itself."""

import re
import subprocess
import sys

FLAGS = {key: f"--{key}" for key in ("index-url", "extra-index-url", "find-links", "constraint")}
# pip's precedence, lowest first: a later scope's value replaces an earlier one's
SCOPES = ["global", "user", "site", ":env:"]

listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
values: dict[str, tuple[int, str]] = {}
for scope, key, value in re.findall(r"^(:env:|global|user|site)\.([\w-]+)='(.*)'$", listed, re.MULTILINE):
    rank = SCOPES.index(scope)
    if key in FLAGS and rank >= values.get(key, (-1, ""))[0]:
        values[key] = (rank, value)
args = [arg for key, (_, value) in values.items() for item in value.split() for arg in (FLAGS[key], item)]
# pip picks the best version across all its indexes; uv by default stops at the first index that has the package
print("\n".join([*args, "--index-strategy", "unsafe-best-match"]))
