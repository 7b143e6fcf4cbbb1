"""The training side: DeepSpeed engines (one Ray actor per rank) and the logprobs they compute."""

import os

# Without a GPU, DeepSpeed guesses its accelerator and warns on every import; say it before anything here imports it
# (Ray's actors, started later, inherit it).
if "DS_ACCELERATOR" not in os.environ:
    import torch

    os.environ["DS_ACCELERATOR"] = "cuda" if torch.cuda.is_available() else "cpu"
