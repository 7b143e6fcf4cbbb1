"""pass@k (Chen et al. 2021) against its closed form and against counting k-subsets one by one."""

import itertools
import math
from fractions import Fraction

import pytest

from oxrl_core.evaluation.passk import mean_pass_at_k, pass_at_k


def closed_form(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def enumerated(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n samples (the first c correct) that hold a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_equals_counting_every_k_subset_for_small_n(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(enumerated(n, c, k), abs=1e-12), (n, c, k)


def test_no_correct_sample_gives_0_and_all_correct_gives_1():
    for n, k in [(1, 1), (8, 1), (8, 8), (100, 10)]:
        assert pass_at_k(n, 0, k) == 0.0
        assert pass_at_k(n, n, k) == 1.0


def test_pass_at_1_is_the_share_of_correct_samples():
    for n, c in [(1, 1), (8, 3), (10, 7), (200, 37)]:
        assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)


def test_pass_at_n_is_whether_any_sample_is_correct():
    for n, c in [(5, 1), (5, 4), (16, 2)]:
        assert pass_at_k(n, c, n) == 1.0
    assert pass_at_k(16, 0, 16) == 0.0


@pytest.mark.parametrize("n, c, k", [(20, 5, 3), (64, 10, 8), (100, 1, 50), (37, 36, 2)])
def test_equals_the_closed_form(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(closed_form(n, c, k), abs=1e-12)


def test_large_n_matches_exact_rational_arithmetic():
    """C(2000, 500) has 487 digits: far past float range, but the product form stays exact to rounding."""
    n, c, k = 2000, 3, 500
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_the_benchmark_score_is_the_mean_over_problems():
    correct, n, k = [0, 2, 5, 8], 8, 3
    expected = sum(closed_form(n, c, k) for c in correct) / len(correct)
    assert mean_pass_at_k(correct, n, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n, c, k", [(4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1)])
def test_refuses_k_outside_1_to_n_and_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match=f"pass@{k}"):
        pass_at_k(n, c, k)
