"""oxrl: readable post-training for LLMs on DeepSpeed, vLLM and Ray."""

from oxrl_core.version import __version__

__all__ = ["Trainer", "__version__"]  # `oxrl_core.__version__`; `Trainer` on first use (below)


def __getattr__(name: str):
    # `from oxrl_core import Trainer` without importing the trainer's stack for every `import oxrl_core`
    if name == "Trainer":
        from oxrl_core.api import Trainer

        return Trainer
    raise AttributeError(f"module 'oxrl_core' has no attribute {name!r}")
