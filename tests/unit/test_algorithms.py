"""The algorithm records: one file per algorithm is all the loops need, and nothing outside `algs/` branches on a name."""

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import torch

from oxrl_core.algs import registry
from oxrl_core.algs.base import GlobalBatch, LossArgs
from oxrl_core.algs.registry import ALGORITHMS, RL_ALGS, SL_ALGS
from oxrl_core.config.schema import RLTrain, SLTrain

REPO = Path(__file__).resolve().parents[2]


def test_the_names_read_from_the_files_are_the_records_names_and_loops():
    assert sorted(SL_ALGS + RL_ALGS) == sorted(ALGORITHMS)
    assert all(ALGORITHMS[name].loop == "sl" for name in SL_ALGS) and all(ALGORITHMS[name].loop == "rl" for name in RL_ALGS)
    assert SL_ALGS[0] == "sft" and RL_ALGS[0] == "cispo"  # each loop's default first


def test_the_config_allows_exactly_the_registered_names():
    assert set(SLTrain.model_fields["alg"].annotation.__args__) == set(SL_ALGS)
    assert set(RLTrain.model_fields["alg"].annotation.__args__) == set(RL_ALGS)


def test_a_new_file_with_a_record_is_registered_without_editing_another(tmp_path, monkeypatch):
    """The registry reads the package folder: adding an algorithm touches its own file only."""
    for path in registry.HERE.glob("*.py"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "my_alg.py").write_text('from oxrl_core.algs import sft\nfrom oxrl_core.algs.base import Algorithm\n\n'
                                        'ALGORITHM = Algorithm("my-alg", "rl", "prompts", sft.batch_loss, sft.make_args)\n')
    monkeypatch.setattr(registry, "HERE", tmp_path)
    assert registry._declared()["my-alg"] == "rl"


def _pure_loss(module) -> inspect.Signature:
    (loss,) = [f for name, f in vars(module).items() if name.endswith("_loss") and name != "batch_loss" and inspect.isfunction(f)
               and f.__module__ == module.__name__]
    return inspect.signature(loss)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_records_typed_arguments_are_its_pure_losss_keyword_arguments(name):
    """`batch_loss` passes the args as the pure loss's keywords: a field missing or extra would fail at the first step."""
    algorithm = ALGORITHMS[name]
    module = inspect.getmodule(algorithm.loss)
    keywords = {p.name for p in _pure_loss(module).parameters.values() if p.kind is p.KEYWORD_ONLY}
    if not keywords:  # SFT's loss takes its normaliser positionally
        keywords = {p.name for p in _pure_loss(module).parameters.values()} - {"logprobs", "response_mask"}
    train = (SLTrain if algorithm.loop == "sl" else RLTrain)(alg=name)
    batch = GlobalBatch([{"response_mask": torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])}], max_len=8.0, kl_baseline=0.5)
    args = algorithm.args(train, batch)
    assert isinstance(args, LossArgs) and dataclasses.is_dataclass(args)
    assert {f.name for f in dataclasses.fields(args)} == keywords


def test_the_global_batch_counts_tokens_rows_and_pairs():
    masks = [torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]),  # pairs (chosen 0, 1; rejected 2, 3)
             torch.tensor([[0.0, 1.0], [1.0, 1.0]])]
    batch = GlobalBatch([{"response_mask": m} for m in masks])
    assert batch.tokens() == 8.0 and batch.sequences() == 6.0 and batch.sequences_with_tokens() == 5.0
    assert batch.pairs() == 2.0  # the first micro-batch's first pair has an empty rejected side: it does not count
    assert [tuple(map(tuple, (c.tolist(), r.tolist()))) for c, r in batch.pair_halves()] == [((2.0, 1.0), (0.0, 2.0)),
                                                                                               ((1.0,), (2.0,))]


def test_which_reference_each_algorithm_has():
    sl, rl = SLTrain(), RLTrain()
    assert ALGORITHMS["dpo"].precomputed_reference(sl) and not ALGORITHMS["dpo"].reference_model(sl)
    assert ALGORITHMS["dpo"].reference_model(SLTrain(alg="dpo", reference="model"))
    assert ALGORITHMS["online-dpo"].reference_model(sl) and not ALGORITHMS["online-dpo"].precomputed_reference(sl)
    assert not ALGORITHMS["spin"].reference_model(sl) and not ALGORITHMS["spin"].precomputed_reference(sl)
    assert not ALGORITHMS["sgrpo"].reference_model(rl) and ALGORITHMS["sgrpo"].reference_model(RLTrain(kl_coeff=0.1))
    assert not ALGORITHMS["simpo"].reference_model(sl) and not ALGORITHMS["simpo"].precomputed_reference(sl)


def _name_branches(path: Path) -> list[str]:
    """Comparisons of something's `.alg` with a string or a tuple of strings: a branch on an algorithm's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(isinstance(s, ast.Attribute) and s.attr == "alg" or isinstance(s, ast.Name) and s.id == "alg"
                    for s in sides)
        literal = any(isinstance(s, ast.Constant) and isinstance(s.value, str) or
                      isinstance(s, (ast.Tuple, ast.List, ast.Set)) and all(isinstance(e, ast.Constant) for e in s.elts)
                      for s in sides)
        if named and literal:
            found.append(f"{path}:{node.lineno}")
    return found


def test_no_code_outside_algs_branches_on_an_algorithms_name():
    files = [p for root in ("oxrl_core", "oxrl_cli") for p in (REPO / root).rglob("*.py")
             if "algs" not in p.relative_to(REPO).parts]
    assert [hit for path in files for hit in _name_branches(path)] == []


def test_the_name_branch_finder_finds_both_kinds_of_branch(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('if config.train.alg in ("rft", "spin"):\n    pass\nif alg == "ppo":\n    pass\nif x.alg == y:\n    pass\n')
    assert _name_branches(probe) == [f"{probe}:1", f"{probe}:3"]
