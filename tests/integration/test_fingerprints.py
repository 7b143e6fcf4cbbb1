"""The recorded runs' numbers, compared with this session's (see fingerprint.py). Sorted after every other test
(tests/conftest.py), so the runs have been seen when these compare."""

import json
import math

import pytest
from fingerprint import FILE, SEEN, TOLERANCE, numerics_key

RECORDED = json.loads(FILE.read_text())

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_run_gives_its_recorded_numbers(name):
    if name not in SEEN:
        pytest.skip(f"the run {name!r} was not part of this session")
    recorded = RECORDED[name]
    if recorded["numerics"] != numerics_key():
        pytest.skip(f"recorded under {recorded['numerics']}, this machine is {numerics_key()}")
    expected, got = recorded["numbers"], SEEN[name]
    assert got.keys() == expected.keys(), (name, sorted(got), sorted(expected))
    for where, values in expected.items():
        # a metric logged since the recording is not a change of the numbers; a recorded one missing is
        assert values.keys() <= got[where].keys(), (name, where, sorted(got[where]), sorted(values))
        for key, value in values.items():
            assert math.isclose(got[where][key], value, rel_tol=TOLERANCE, abs_tol=TOLERANCE) or (
                math.isnan(value) and math.isnan(got[where][key])
            ), (name, where, key, got[where][key], value)
