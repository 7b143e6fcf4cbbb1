"""Rewards for the RL integration tests, imported by `module:function` (PYTHONPATH is this folder)."""


def digit_share(response: str, sample: dict) -> float:
    """Signal even from random weights: the share of digits in the response."""
    return sum(c.isdigit() for c in response) / max(len(response), 1)


def raises_on_odd_length(response: str, sample: dict) -> float:
    if len(response) % 2:
        raise ValueError(f"odd length {len(response)}")
    return 1.0


def nan(response: str, sample: dict) -> float:
    return float("nan")
