"""oxrl: readable post-training for LLMs on DeepSpeed, vLLM and Ray."""

import os

__version__ = "0.1.0"

# Without a GPU, DeepSpeed guesses its accelerator and warns on every import; say it (Ray actors inherit it).
if "DS_ACCELERATOR" not in os.environ:
    import torch

    os.environ["DS_ACCELERATOR"] = "cuda" if torch.cuda.is_available() else "cpu"


def __getattr__(name: str):
    # `from oxrl_core import Trainer` without importing the trainer's stack for every `import oxrl_core`
    if name == "Trainer":
        from oxrl_core.api import Trainer

        return Trainer
    raise AttributeError(f"module 'oxrl_core' has no attribute {name!r}")
