"""DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13): a length-aware penalty added to the
reward, so that a sample is not scored as if a truncated answer were simply wrong."""


def overlong_penalty(length: int, max_tokens: int, buffer: int, penalty: float) -> float:
    """0 up to `max_tokens - buffer` tokens, then falling linearly to -`penalty` at `max_tokens` (and below it
    beyond): min(0, -(length - (max_tokens - buffer)) / buffer * penalty)."""
    return min(0.0, -(length - (max_tokens - buffer)) / buffer * penalty)
