"""The pages stay true: every link resolves, every example a page shows runs, parses or says why it cannot here,
the generated references are current, and user pages read as documentation, not as a log."""

import json
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from doc_pages import DOCS, PAGES, REPO, blocks, commands, quickstart_lines
from typer.main import get_command

from oxrl_core.config.reference import END, START, reference_markdown
from oxrl_core.resolve.run import merged

README = (REPO / "README.md").read_text()
CONFIG_SECTIONS = {"model", "lora", "data", "train", "rollout", "reward", "deepspeed", "run"}
GENERATED = {DOCS / "reference" / "config.md", DOCS / "reference" / "cli.md"}


def test_config_reference_is_generated_from_the_schema():
    page = (DOCS / "reference" / "config.md").read_text()
    block = page.split(START)[1].split(END)[0].strip()
    assert block == reference_markdown().strip(), (
        "stale: run python -m oxrl_core.config.reference docs/reference/config.md"
    )


def test_the_two_commands_are_the_makefile_targets_and_ci_runs_the_whole_suite():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands_ = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands_ == ["make demo", "make test"]
    makefile = (REPO / "Makefile").read_text()
    assert "\ndemo: install\n\t.venv/bin/oxrl demo\n" in makefile and "\ntest: install\n" in makefile
    assert "\ntest-all: install\n" in makefile and "`make test-all`" in README
    ci = [
        line
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci == ["make test-all"]


def test_every_train_command_of_the_docs_validates(tmp_path, tiny_model_dir, monkeypatch):
    """Every `oxrl train ...` line of every page parses and validates (dry run), through the CLI app in this process
    (the console script's start-up is tested elsewhere and costs seconds per line), from a folder holding the shipped
    examples and the SFT example's model, which the examples that start from it name (a stand-in: the tiny model).
    The quick start's lines build on each other's outputs: tests/integration/test_quickstart.py runs them for real,
    wherever a page repeats them."""
    from typer.testing import CliRunner

    from oxrl_cli.main import app

    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "checkpoints" / "sft-tiny").mkdir(parents=True)
    (tmp_path / "checkpoints" / "sft-tiny" / "final").symlink_to(tiny_model_dir)
    monkeypatch.chdir(tmp_path)
    lines = [c for c in commands("oxrl train ") if c.text not in quickstart_lines() and not c.marker]
    assert len(lines) >= 10
    for line in lines:
        args = shlex.split(line.text)[1:]
        if "--resume" in args:
            args.remove("--resume")  # resuming needs a run; its validation is the same
        result = CliRunner().invoke(app, [*args, "--dry-run", f"run.output_dir={tmp_path / 'runs'}"])
        assert result.exit_code == 0 and result.exception is None, (line.where, result.output, result.exception)
        assert "train:" in result.output  # the resolved config was printed


def _parse_error(argv: list[str]) -> str | None:
    """Parse a command line as the `oxrl` app would, sub-command by sub-command, without running it: the message of
    an unknown option, a missing argument or a bad choice, else None. (Typer carries its own copy of click, so its
    classes are recognised by what they do.)"""
    from oxrl_cli.main import app

    command, name, parent = get_command(app), "oxrl", None
    while True:
        try:
            ctx = command.make_context(name, argv, parent=parent)
        except Exception as e:
            if type(e).__name__ == "Exit":  # --help, --version
                return None
            if hasattr(e, "format_message"):
                return e.format_message()
            raise
        if not hasattr(command, "resolve_command"):
            return None
        name, command, argv = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        parent = ctx


def test_the_command_line_parser_check_refuses_what_the_cli_refuses():
    assert _parse_error(["doctor", "--json"]) is None and _parse_error(["--version"]) is None
    assert "--bogus" in _parse_error(["doctor", "--bogus"])
    assert "ADAPTER" in _parse_error(["merge-lora", "--out", "merged"]).upper()


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))


def test_every_command_a_page_shows_runs_or_parses_in_the_suite_or_says_why_not():
    """`oxrl train` lines validate (above), `oxrl preprocess` and `oxrl eval` lines run (their CLI tests), the quick
    start runs (its integration test); every other `oxrl` line must parse, every `make` target exist, and anything
    else carry a marker saying what it needs."""
    quickstart, targets, unexplained = quickstart_lines(), _makefile_targets(), []
    for line in commands():
        words = shlex.split(line.text)
        if line.marker or line.text in quickstart or line.text == "source .venv/bin/activate":
            continue
        if words[0] == "make":
            assert words[1] in targets, (line.where, f"no Makefile target {words[1]}")
        elif words[0] == "oxrl" and words[1] not in ("train", "preprocess", "eval"):
            assert (error := _parse_error(words[1:])) is None, f"{line.where}: {line.text}: {error}"
        elif words[0] != "oxrl":
            unexplained.append(f"{line.where}: {line.text}")
    assert not unexplained, "run in the suite, or end with a marker (# needs a GPU, ...):\n" + "\n".join(unexplained)


def test_every_json_line_and_config_fragment_a_page_shows_parses():
    for block in blocks("json"):
        for offset, line in enumerate(block.text.splitlines(), start=1):
            if block.text.lstrip().startswith("{\n"):  # one pretty-printed object
                json.loads(block.text)
                break
            try:
                json.loads(line)
            except json.JSONDecodeError as e:
                raise AssertionError(f"{block.where}+{offset}: {e}") from None
    from oxrl_core.config.load import validate
    from oxrl_core.config.schema import RLConfig, SLConfig
    from oxrl_core.errors import OxrlError

    examples = [
        (RLConfig, yaml.safe_load((REPO / "examples" / "cispo_tiny.yaml").read_text())),
        (SLConfig, yaml.safe_load((REPO / "examples" / "sft_tiny.yaml").read_text())),
    ]
    for block in blocks("yaml"):  # a fragment of a config: set on a shipped example, it validates as an RL or SL run's
        fragment = yaml.safe_load(block.text)
        assert isinstance(fragment, dict) and set(fragment) <= CONFIG_SECTIONS, (block.where, sorted(fragment))
        errors = []
        for schema, example in examples:
            try:
                validate(schema, merged(example, fragment))
                break
            except OxrlError as e:
                errors.append(str(e))
        else:
            raise AssertionError(f"{block.where}: {errors}")


def test_every_python_snippet_a_page_shows_runs(tmp_path):
    """Each runs as written from the repository root; the Python API's, which trains, runs in
    tests/integration/test_api.py."""
    snippets = [b for b in blocks("python") if "Trainer(" not in b.text]
    assert snippets
    for block in snippets:
        result = subprocess.run(
            [sys.executable, "-c", block.text], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, (block.where, result.stderr[-2000:])


def test_the_readme_stays_a_page_and_no_docs_page_is_a_book():
    assert len(README.splitlines()) <= 200
    long_pages = [
        f"{p.relative_to(REPO)}: {n}"
        for p in DOCS.rglob("*.md")
        if p not in GENERATED and (n := len(p.read_text().splitlines())) > 400
    ]
    assert not long_pages


USER_PAGES = [p for p in PAGES if p.name != "CONTRIBUTING.md" and DOCS / "design" not in p.parents]
LOG_WORDS = re.compile(r"(?<![.\w])sessions?\b|\bissue #?\d+|\bcommit\b|\bthis machine\b|\buntil verified here\b", re.I)
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


LOGS = [REPO / "benchmarks" / "RESULTS.md", REPO / "benchmarks" / "README.md"]  # measurements, out of the user's path


def test_user_pages_name_no_test_file_session_commit_or_file_outside_the_repository():
    """The measurement logs may name the test or script that measured; no page names a session, commit or issue."""
    found = []
    for page in USER_PAGES + LOGS:
        patterns = (r"\.\./shared", LOG_WORDS, COMMIT_HASH) + (() if page in LOGS else (r"\btests/",))
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            for pattern in patterns:
                if match := re.search(pattern, line):
                    found.append(f"{page.relative_to(REPO)}:{number}: {match.group(0)!r}")
    assert not found, "\n".join(found)


def test_the_7b_lora_example_validates_with_local_stand_ins_for_its_model_and_data(
    tmp_path, tiny_model_dir, monkeypatch
):
    """examples/cispo_lora_7b.yaml names a Hub model and GSM8K, which these machines cannot download: everything else
    in it (LoRA targets, batch arithmetic, rollout lengths) is validated with the tiny model and one prompt."""
    from typer.testing import CliRunner

    from oxrl_cli.main import app

    monkeypatch.chdir(REPO)
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    base = [
        "train",
        "rl",
        "--config",
        "examples/cispo_lora_7b.yaml",
        "--dry-run",
        f"model.name_or_path={tiny_model_dir}",
        f"data.train=[{{path: {data}}}]",
        f"run.output_dir={tmp_path}",
    ]
    for overrides in ([], ["rollout.gpu_memory_utilization=0.45", "train.micro_batch_size=8", "train.grad_accum=64"]):
        result = CliRunner().invoke(app, [*base, *overrides])
        assert result.exit_code == 0 and result.exception is None, (overrides, result.output, result.exception)
        assert "lora:" in result.output and "enabled: true" in result.output


SHIPPED_EXAMPLES = sorted(
    str(path.relative_to(REPO / "examples").with_suffix("")) for path in (REPO / "examples").rglob("*.yaml")
)
HUB_EXAMPLES = {"cispo_lora_7b"}  # names a Hub model and dataset: validated with local stand-ins above


@pytest.mark.parametrize("example", [e for e in SHIPPED_EXAMPLES if e not in HUB_EXAMPLES])
def test_every_shipped_example_validates_as_shipped(example, tmp_path, tiny_model_dir, monkeypatch):
    """Each file of examples/, unchanged, passes `--dry-run`, from a folder holding the examples and the SFT
    example's model (a stand-in: the tiny model), which the examples that start from it name."""
    from typer.testing import CliRunner

    from oxrl_cli.main import app
    from oxrl_core.algs.registry import RL_ALGS

    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "checkpoints" / "sft-tiny").mkdir(parents=True)
    (tmp_path / "checkpoints" / "sft-tiny" / "final").symlink_to(tiny_model_dir)
    monkeypatch.chdir(tmp_path)
    alg = yaml.safe_load((REPO / "examples" / f"{example}.yaml").read_text())["train"]["alg"]
    loop = "rl" if alg in RL_ALGS else "sl"
    result = CliRunner().invoke(
        app, ["train", loop, "--config", f"examples/{example}.yaml", "--dry-run", f"run.output_dir={tmp_path / 'runs'}"]
    )
    assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)
    assert f"alg: {alg}" in result.output
