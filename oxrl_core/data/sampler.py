"""Mixed-ratio sampling over several sources, restartable from a small state.

Each step draws every sample's source with probability ratio / sum(ratios);
each source walks its own seeded permutation, a new one per epoch. The state
is the step and how many examples each source has given, so a resumed run
continues with exactly the batches the uninterrupted run would have seen.
"""

import numpy as np

from oxrl_core.errors import OxrlError


class MixedSampler:
    """Batches of (source index, example index) from sources of `sizes` examples, mixed by `ratios`."""

    def __init__(self, sizes: list[int], ratios: list[float], seed: int):
        self.sizes, self.seed = sizes, seed
        self.probs = np.asarray(ratios, dtype=np.float64) / sum(ratios)
        self.step = 0
        self.consumed = [0] * len(sizes)
        self._permutations: dict[int, tuple[int, np.ndarray]] = {}  # source -> (epoch, order)

    def next_batch(self, n: int) -> list[tuple[int, int]]:
        """`n` (source index, example index) pairs."""
        sources = np.random.default_rng([self.seed, self.step]).choice(len(self.sizes), size=n, p=self.probs)
        self.step += 1
        return [(int(s), self._next_index(int(s))) for s in sources]

    def _next_index(self, source: int) -> int:
        epoch, position = divmod(self.consumed[source], self.sizes[source])
        self.consumed[source] += 1
        return int(self._permutation(source, epoch)[position])

    def _permutation(self, source: int, epoch: int) -> np.ndarray:
        cached = self._permutations.get(source)
        if cached is None or cached[0] != epoch:
            cached = (epoch, np.random.default_rng([self.seed, source, epoch]).permutation(self.sizes[source]))
            self._permutations[source] = cached
        return cached[1]

    def state_dict(self) -> dict:
        """JSON-serialisable: the next step and how many examples each source has given."""
        return {"step": self.step, "consumed": list(self.consumed)}

    def load_state_dict(self, state: dict) -> None:
        if len(state["consumed"]) != len(self.sizes):
            raise OxrlError(
                f"data.train: the resumed run sampled {len(state['consumed'])} sources, this config has "
                f"{len(self.sizes)}; resume with the same data.train"
            )
        self.step, self.consumed = state["step"], list(state["consumed"])
