"""A failed run's crash.json (loops/crash.py) as a bug report: a Markdown issue body with secrets and the home folder
redacted, and its submission through GitHub's REST API (`POST /repos/{owner}/{repo}/issues`)."""

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

from oxrl_core.errors import OxrlError
from oxrl_core.version import __version__

REPOSITORY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+$")
SECRETS = (
    re.compile(
        r"\b(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}"
        r"|AKIA[0-9A-Z]{16})\b"
    ),
    re.compile(r"(?i)\bBearer\s+\S+"),
)
# `name: value` / `name=value` whose name says it holds a secret (a tokenizer's special tokens do not)
SECRET_SETTING = re.compile(r"(?i)\b([\w.-]*(?:token|secret|password|api_key|apikey))(\s*[:=]\s*)([^\s,}]+)")
SPECIAL_TOKENS = {"pad_token", "eos_token", "bos_token", "unk_token", "sep_token", "cls_token", "mask_token"}
# what GitHub's refusals mean for this request
REFUSALS = {
    401: "the token was refused: GITHUB_TOKEN must be a valid token",
    403: "the token may not create issues there: it needs the Issues permission (write) on that repository",
    404: "no such repository, or the token cannot see it",
    410: "that repository has issues turned off",
    422: "GitHub refused the issue's fields",
}


def redact(text: str, home: Path) -> str:
    """`text` without tokens, secret settings' values, or the home folder's path (it names the user)."""
    for pattern in SECRETS:
        text = pattern.sub("[redacted]", text)
    text = SECRET_SETTING.sub(lambda m: m[0] if m[1].lower() in SPECIAL_TOKENS else f"{m[1]}{m[2]}[redacted]", text)
    return text.replace(str(home), "~") if str(home) not in ("", "/") else text


def issue_from_crash(run_dir: Path, home: Path) -> tuple[str, str]:
    """(title, Markdown body) for the failure recorded in `run_dir`/crash.json."""
    path = run_dir / "crash.json"
    if not path.is_file():
        raise OxrlError(
            f"{path}: not found; a run leaves crash.json when it fails inside oxrl (a config or data "
            f"mistake is reported at once and leaves none)"
        )
    try:
        crash = json.loads(path.read_text())
        error = crash["error"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise OxrlError(f"{path}: not a crash report oxrl wrote ({type(e).__name__}: {e})") from None
    where = f"step {crash['step']}" if crash.get("step") is not None else "start-up"
    actor = f" in {error['actor']}" if error.get("actor") else ""
    title = f"{error['class']}{actor} at {where} ({crash.get('phase')})"
    versions = ", ".join(f"{name} {v}" for name, v in crash.get("versions", {}).items() if v != "not installed")
    lines = [
        f"**{error['class']}{actor}** at {where}, phase `{crash.get('phase')}`, policy version "
        f"{crash.get('policy_version')}.",
        "",
        "```",
        error["message"].strip()[:2000],
        "```",
        "",
    ]
    if crash.get("likely_cause"):
        lines += [f"**Likely cause:** {crash['likely_cause']}. **Fix:** {crash['fix']}.", ""]
    lines += [
        f"**Versions:** {versions}",
        f"**GPUs:** {', '.join(crash.get('gpus') or []) or 'none (CPU)'}",
        f"**Config** (sha256 `{crash.get('config_sha256', '')[:16]}`):",
        "",
        "```yaml",
        crash.get("config", "").strip(),
        "```",
        "",
    ]
    lines += _details("Traceback", crash.get("traceback", "").strip()[-6000:])
    for name, log in crash.get("logs", {}).items():
        lines += _details(f"Last lines of {name}.log", "\n".join(log))
    lines.append(f"<sub>Written by `oxrl report` (oxrl {__version__}).</sub>")
    return redact(title, home), redact("\n".join(lines), home)


def _details(summary: str, text: str) -> list[str]:
    return ["<details><summary>" + summary + "</summary>", "", "```", text, "```", "", "</details>", ""] if text else []


def submit_issue(repository: str, title: str, body: str, token: str, api_url: str) -> str:
    """Opens the issue on GitHub (or the API at `api_url`); returns its web address."""
    if not REPOSITORY.match(repository):
        raise OxrlError(f"--submit {repository!r}: give the repository as OWNER/REPO, e.g. oxrl/oxrl")
    url = f"{api_url.rstrip('/')}/repos/{repository}/issues"
    request = urllib.request.Request(
        url,
        method="POST",
        data=json.dumps({"title": title, "body": body}).encode(),
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "Content-Type": "application/json",
            "User-Agent": f"oxrl/{__version__}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)["html_url"]
    except urllib.error.HTTPError as e:
        try:
            said = json.loads(e.read()).get("message", "")
        except (json.JSONDecodeError, AttributeError):
            said = ""
        why = REFUSALS.get(e.code, "GitHub did not take the issue")
        raise OxrlError(f"POST {url}: {e.code} {said or e.reason}: {why}") from None
    except (urllib.error.URLError, OSError, KeyError, json.JSONDecodeError) as e:
        raise OxrlError(
            f"POST {url}: no answer ({getattr(e, 'reason', e)}): check the network, or GITHUB_API_URL "
            f"for a GitHub Enterprise server"
        ) from None
