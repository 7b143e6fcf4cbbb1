"""`oxrl report`: a failed run's crash report as an issue body, and `--submit` to a stand-in for GitHub's REST API on
127.0.0.1 (nothing leaves the machine)."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import ray

from oxrl_core.loops.crash import crash_report

LOCAL = {"NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1", "GITHUB_TOKEN": "ghp_testtokentesttokentesttoken0000"}


@pytest.fixture
def failed_run(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "engine0.log").write_text("INFO engine started\n")
    died = ray.exceptions.ActorDiedError()
    died.actor = "engine0"
    with pytest.raises(ray.exceptions.ActorDiedError), crash_report(run, "train: {alg: cispo}\n") as position:
        position.step, position.phase, position.policy_version = 2, "refresh", 1
        raise died
    return run


class GitHubStandIn(BaseHTTPRequestHandler):
    """Answers POST /repos/{owner}/{repo}/issues with `status` and records each request."""

    status, requests = 201, []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "headers": dict(self.headers), "json": body})
        answer = (
            {"html_url": "https://github.com/o/r/issues/7"} if self.status == 201 else {"message": "Bad credentials"}
        )
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(answer).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def github(request):
    GitHubStandIn.status, GitHubStandIn.requests = getattr(request, "param", 201), []
    server = HTTPServer(("127.0.0.1", 0), GitHubStandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", GitHubStandIn.requests
    server.shutdown()


def test_report_prints_the_issue_body_and_keeps_it_in_the_run_folder(oxrl, failed_run):
    result = oxrl("report", failed_run)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# ActorDiedError in engine0 at step 2 (refresh)\n")
    assert "INFO engine started" in result.stdout and "train: {alg: cispo}" in result.stdout
    assert (failed_run / "issue.md").read_text() == result.stdout


def test_submit_posts_the_issue_to_the_api_with_the_token_and_prints_its_address(oxrl, failed_run, github):
    api, requests = github
    result = oxrl("report", failed_run, "--submit", "o/r", env=LOCAL | {"GITHUB_API_URL": api})
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "opened https://github.com/o/r/issues/7"
    [request] = requests
    assert request["path"] == "/repos/o/r/issues"
    assert request["headers"]["Authorization"] == f"Bearer {LOCAL['GITHUB_TOKEN']}"
    assert request["headers"]["Accept"] == "application/vnd.github+json"
    assert request["json"]["title"] == "ActorDiedError in engine0 at step 2 (refresh)"
    assert request["json"]["body"] in result.stdout and LOCAL["GITHUB_TOKEN"] not in request["json"]["body"]


@pytest.mark.parametrize("github", [401], indirect=True)
def test_a_refused_token_is_one_line_exits_non_zero_and_keeps_the_report(oxrl, failed_run, github):
    api, requests = github
    result = oxrl("report", failed_run, "--submit", "o/r", env=LOCAL | {"GITHUB_API_URL": api})
    assert result.returncode == 2 and len(requests) == 1
    assert result.stderr.count("\n") == 1 and "401 Bad credentials: the token was refused" in result.stderr
    assert f"the report is in {failed_run / 'issue.md'}" in result.stderr and (failed_run / "issue.md").is_file()


def test_an_api_that_does_not_answer_is_one_line_exits_non_zero_and_keeps_the_report(oxrl, failed_run):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = oxrl("report", failed_run, "--submit", "o/r", env=LOCAL | {"GITHUB_API_URL": f"http://127.0.0.1:{port}"})
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"POST http://127.0.0.1:{port}/repos/o/r/issues: no answer (" in result.stderr
    assert (failed_run / "issue.md").is_file()


@pytest.mark.parametrize(
    "repository, env, says",
    [
        ("o/r", {"GITHUB_TOKEN": ""}, "--submit o/r: GITHUB_TOKEN is not set"),
        ("just-a-name", LOCAL, "--submit 'just-a-name': give the repository as OWNER/REPO"),
    ],
)
def test_submit_without_a_token_or_with_a_malformed_repository_is_one_line(oxrl, failed_run, repository, env, says):
    result = oxrl("report", failed_run, "--submit", repository, env=env)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and says in result.stderr, result.stderr


def test_a_folder_without_a_crash_report_is_one_line(oxrl, tmp_path):
    result = oxrl("report", tmp_path)
    assert result.returncode == 2 and f"{tmp_path / 'crash.json'}: not found" in result.stderr
