"""A failed run's crash.json (loops/crash.py) and the issue body made of it (tracking/issue.py)."""

import json
from pathlib import Path

import pytest
import ray

from oxrl_core.errors import OxrlError
from oxrl_core.loops.crash import crash_report
from oxrl_core.tracking.issue import issue_from_crash, redact


def crashed_run(run: Path, error: BaseException, config: str = "train: {lr: 0.1}\n") -> dict:
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "engine0.log").write_text("".join(f"engine line {i}\n" for i in range(100)))
    (run / "logs" / "rank0.log").write_text("rank line\n")
    with pytest.raises(type(error)), crash_report(run, config) as position:
        position.step, position.phase, position.policy_version = 3, "refresh", 2
        raise error
    return json.loads((run / "crash.json").read_text())


def test_crash_json_says_what_failed_in_which_actor_where_with_each_actors_last_log_lines_and_the_known_cause(tmp_path):
    died = ray.exceptions.ActorDiedError()
    died.actor = "engine0"  # as the run's ActorWatch names the actor whose call failed
    crash = crashed_run(tmp_path / "run", died)
    assert crash["error"]["class"] == "ActorDiedError" and crash["error"]["actor"] == "engine0"
    assert (crash["step"], crash["phase"], crash["policy_version"]) == (3, "refresh", 2)
    assert crash["logs"]["engine0"] == [f"engine line {i}" for i in range(70, 100)] and crash["logs"]["rank0"] == [
        "rank line"
    ]
    assert "died" in crash["likely_cause"] and "--resume" in crash["fix"]
    assert crash["versions"]["torch"] != "not installed" and isinstance(crash["gpus"], list)
    assert len(crash["config_sha256"]) == 64 and "ActorDiedError" in crash["traceback"]
    assert "train: {lr: 0.1}" in (tmp_path / "run" / "crash.txt").read_text()  # the person's report stays


def test_a_failure_oxrl_does_not_know_has_no_likely_cause_and_a_run_that_had_not_started_its_steps_says_so(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(ZeroDivisionError), crash_report(run, ""):
        _ = 1 / 0
    crash = json.loads((run / "crash.json").read_text())
    assert (crash["step"], crash["phase"], crash["likely_cause"], crash["fix"]) == (None, "start-up", None, None)
    assert crash["logs"] == {} and crash["error"]["actor"] is None
    title, body = issue_from_crash(run, Path("/nowhere"))
    assert title == "ZeroDivisionError at start-up (start-up)" and "Likely cause" not in body


def test_the_issue_names_the_failure_the_actor_and_the_step_and_redacts_secrets_and_the_home_folder(tmp_path):
    home = tmp_path / "home" / "alice"
    died = ray.exceptions.ActorDiedError()
    died.actor = "engine0"
    config = f"model: {{name_or_path: {home}/models/m}}\nreward: {{kwargs: {{api_key: abc123}}}}\n"
    crashed_run(tmp_path / "run", died, config)
    (tmp_path / "run" / "crash.json").write_text(
        (tmp_path / "run" / "crash.json")
        .read_text()
        .replace(
            "engine line 99", "engine line 99 hf_abcdefghijklmnopqrstuvwxyz token=ghp_abcdefghijklmnopqrstuvwxyz0123"
        )
    )
    title, body = issue_from_crash(tmp_path / "run", home)
    assert title == "ActorDiedError in engine0 at step 3 (refresh)"
    assert "phase `refresh`, policy version 2" in body and "**Likely cause:** an actor's process died" in body
    assert "name_or_path: ~/models/m" in body and str(home) not in body
    assert "api_key: [redacted]" in body and "abc123" not in body
    assert "hf_abc" not in body and "ghp_abc" not in body and "engine line 99 [redacted] token=[redacted]" in body
    assert "<summary>Last lines of engine0.log</summary>" in body and "<summary>Traceback</summary>" in body


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Authorization: Bearer abc.def", "Authorization: [redacted]"),
        ("  hf_token: hf_123", "  hf_token: [redacted]"),
        ("password=hunter2", "password=[redacted]"),
        ("key AKIAABCDEFGHIJKLMNOP here", "key [redacted] here"),
        ("{kwargs: {api_key: abc, n: 2}}", "{kwargs: {api_key: [redacted], n: 2}}"),
        ("max_tokens: 8, pad_token: <|endoftext|>", "max_tokens: 8, pad_token: <|endoftext|>"),  # not secrets
    ],
)
def test_redaction_covers_tokens_and_settings_named_as_secrets(text, expected):
    assert redact(text, Path("/home/bob")) == expected


def test_a_folder_without_a_crash_report_or_with_a_foreign_one_is_a_clear_error(tmp_path):
    with pytest.raises(OxrlError, match=r"crash.json: not found; a run leaves crash.json when it fails"):
        issue_from_crash(tmp_path, Path("/home/bob"))
    (tmp_path / "crash.json").write_text("{not json")
    with pytest.raises(OxrlError, match=r"crash.json: not a crash report oxrl wrote \(JSONDecodeError"):
        issue_from_crash(tmp_path, Path("/home/bob"))
