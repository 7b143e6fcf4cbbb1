"""oxrl: readable post-training for LLMs on DeepSpeed, vLLM and Ray."""

from oxrl_core.version import __version__  # re-exported: `oxrl_core.__version__`


def __getattr__(name: str):
    # `from oxrl_core import Trainer` without importing the trainer's stack for every `import oxrl_core`
    if name == "Trainer":
        from oxrl_core.api import Trainer

        return Trainer
    raise AttributeError(f"module 'oxrl_core' has no attribute {name!r}")
