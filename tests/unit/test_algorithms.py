"""The algorithm records: one file per algorithm is all the loops need, and nothing outside `algs/` branches on a name."""

import ast
import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oxrl_core.algs.base import GlobalBatch, LossArgs
from oxrl_core.algs.registry import ALGORITHMS, RL_ALGS, SL_ALGS
from oxrl_core.config.schema import RLTrain, SLTrain

REPO = Path(__file__).resolve().parents[2]


def test_the_listed_names_are_the_records_names_and_loops():
    assert sorted(SL_ALGS + RL_ALGS) == sorted(ALGORITHMS)
    assert all(ALGORITHMS[name].loop == "sl" for name in SL_ALGS) and all(
        ALGORITHMS[name].loop == "rl" for name in RL_ALGS
    )
    assert SL_ALGS[0] == "sft" and RL_ALGS[0] == "cispo"  # each loop's default first


def test_the_config_allows_exactly_the_registered_names_each_with_its_own_block():
    assert set(SLTrain.model_fields["alg"].annotation.__args__) == set(SL_ALGS)
    assert set(RLTrain.model_fields["alg"].annotation.__args__) == set(RL_ALGS)
    blocks = {f.alias: f.annotation for f in (SLTrain.model_fields | RLTrain.model_fields).values() if f.alias}
    assert blocks == {name: ALGORITHMS[name].settings | None for name in ALGORITHMS}


# CONTRIBUTING's worked example: its algorithm file, as the guide prints it
SCRATCH = (
    (REPO / "CONTRIBUTING.md")
    .read_text()
    .split("A worked example:", 1)[1]
    .split("```python\n", 1)[1]
    .split("```", 1)[0]
)

CHECK_SCRATCH = """
import sys
from oxrl_core.algs import registry
registry.DECLARED["scaled-sft"] = ("sl", "scaled_sft")  # its line in the registry (here: outside the package)
from oxrl_core.algs.base import GlobalBatch
from oxrl_core.config.load import load_config
from oxrl_core.config.reference import reference_markdown
from oxrl_core.config.schema import SLConfig
from oxrl_core.errors import OxrlError

data = [f"data.train=[{{path: {sys.argv[1]}}}]", "train.alg=scaled-sft"]
config = load_config(SLConfig, None, [*data, "train.scaled-sft.scale=2.5"])
args = registry.ALGORITHMS["scaled-sft"].args(config.train.settings, GlobalBatch([]))
print(args.scale, load_config(SLConfig, None, data).train.settings.scale)
for bad in ("train.scaled-sft.scale=-1", "train.scaled-sft.scal=2"):
    try:
        load_config(SLConfig, None, [*data, bad])
    except OxrlError as e:
        print(e)
print("train.scaled-sft.scale" in reference_markdown())
"""


def test_a_scratch_algorithm_with_a_setting_of_its_own_registers_and_validates(tmp_path):
    """What adding an algorithm is (CONTRIBUTING's worked example): its file, declaring its settings, and its line
    in the registry; the config then takes, checks and documents `train.<alg>.<setting>`."""
    (tmp_path / "scaled_sft.py").write_text(SCRATCH)  # the guide's file, verbatim
    data = tmp_path / "chat.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    result = subprocess.run(
        [sys.executable, "-c", CHECK_SCRATCH, str(data)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scales, negative, typo, documented = result.stdout.strip().splitlines()
    assert (scales, documented) == ("2.5 1.0", "True")  # set, and its default; in the config reference
    assert "train.scaled-sft.scale=-1" in negative and "greater than 0" in negative
    assert "unknown key 'train.scaled-sft.scal'" in typo and "allowed here: scale" in typo


def _pure_loss(module) -> inspect.Signature:
    (loss,) = [
        f
        for name, f in vars(module).items()
        if name.endswith("_loss") and name != "batch_loss" and inspect.isfunction(f) and f.__module__ == module.__name__
    ]
    return inspect.signature(loss)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_records_typed_arguments_are_its_pure_losss_keyword_arguments(name):
    """`batch_loss` passes the args as the pure loss's keywords: a field missing or extra would fail at the first step."""
    algorithm = ALGORITHMS[name]
    module = inspect.getmodule(algorithm.loss)
    keywords = {p.name for p in _pure_loss(module).parameters.values() if p.kind is p.KEYWORD_ONLY}
    if not keywords:  # SFT's loss takes its normaliser positionally
        keywords = {p.name for p in _pure_loss(module).parameters.values()} - {"logprobs", "response_mask"}
    batch = GlobalBatch(
        [{"response_mask": torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])}], max_tokens=8.0, kl_baseline=0.5
    )
    args = algorithm.args(algorithm.settings(), batch)
    assert isinstance(args, LossArgs) and dataclasses.is_dataclass(args)
    assert {f.name for f in dataclasses.fields(args)} == keywords


def test_the_global_batch_counts_tokens_rows_and_pairs():
    masks = [
        torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]),  # pairs (chosen 0, 1; rejected 2, 3)
        torch.tensor([[0.0, 1.0], [1.0, 1.0]]),
    ]
    batch = GlobalBatch([{"response_mask": m} for m in masks])
    assert batch.tokens() == 8.0 and batch.sequences() == 6.0 and batch.sequences_with_tokens() == 5.0
    assert batch.pairs() == 2.0  # the first micro-batch's first pair has an empty rejected side: it does not count
    assert [tuple(map(tuple, (c.tolist(), r.tolist()))) for c, r in batch.pair_halves()] == [
        ((2.0, 1.0), (0.0, 2.0)),
        ((1.0,), (2.0,)),
    ]


def test_which_reference_each_algorithm_has():
    def has(name: str, **settings) -> tuple[bool, bool]:  # (a reference model, precomputed reference logprobs)
        algorithm = ALGORITHMS[name]
        chosen = algorithm.settings(**settings)
        return algorithm.reference_model(chosen), algorithm.precomputed_reference(chosen)

    assert has("dpo") == (False, True) and has("dpo", reference="model") == (True, False)
    assert has("online-dpo") == (True, False) and has("spin") == (False, False) and has("simpo") == (False, False)
    assert has("sgrpo") == (False, False) and has("sgrpo", kl_coeff=0.1) == (True, False)


def _name_branches(path: Path) -> list[str]:
    """Comparisons of something's `.alg` with a string or a tuple of strings: a branch on an algorithm's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(
            isinstance(s, ast.Attribute) and s.attr == "alg" or isinstance(s, ast.Name) and s.id == "alg" for s in sides
        )
        literal = any(
            isinstance(s, ast.Constant)
            and isinstance(s.value, str)
            or isinstance(s, (ast.Tuple, ast.List, ast.Set))
            and all(isinstance(e, ast.Constant) for e in s.elts)
            for s in sides
        )
        if named and literal:
            found.append(f"{path}:{node.lineno}")
    return found


def test_no_code_outside_algs_branches_on_an_algorithms_name():
    files = [
        p
        for root in ("oxrl_core", "oxrl_cli")
        for p in (REPO / root).rglob("*.py")
        if "algs" not in p.relative_to(REPO).parts
    ]
    assert [hit for path in files for hit in _name_branches(path)] == []


def test_the_name_branch_finder_finds_both_kinds_of_branch(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        'if config.train.alg in ("rft", "spin"):\n    pass\nif alg == "ppo":\n    pass\nif x.alg == y:\n    pass\n'
    )
    assert _name_branches(probe) == [f"{probe}:1", f"{probe}:3"]
