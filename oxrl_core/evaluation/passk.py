"""pass@k, the chance that at least one of k samples is correct, estimated without bias from n >= k samples.

Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (Codex),
arXiv 2107.03374, section 2.1: sample n completions of a problem, count the c
correct ones; the share of k-subsets of them that hold a correct one,

    pass@k = 1 - C(n - c, k) / C(n, k),

is unbiased, unlike 1 - (1 - c/n)^k. The benchmark's pass@k is its mean over
problems. The binomials overflow floats for large n; their ratio is the product

    C(n - c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i),

whose factors lie in [0, 1], so it is computed in floats without overflow.
"""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `c` correct among `n` samples."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k}: k must be between 1 and the number of samples per problem, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@{k}: {c} correct samples out of n={n}; allowed: 0 to n")
    if n - c < k:  # fewer than k wrong samples: every k-subset holds a correct one
        return 1.0
    all_wrong = 1.0  # C(n - c, k) / C(n, k): a random k-subset holds only wrong samples
    for i in range(n - c + 1, n + 1):
        all_wrong *= 1.0 - k / i
    return 1.0 - all_wrong


def mean_pass_at_k(correct: list[int], n: int, k: int) -> float:
    """pass@k of a benchmark: the mean over problems, `correct[p]` of problem p's `n` samples being correct."""
    if not correct:
        raise ValueError("pass@k of no problems")
    return sum(pass_at_k(n, c, k) for c in correct) / len(correct)
