"""oxrl: readable post-training for LLMs on DeepSpeed, vLLM and Ray."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `from oxrl_core import Trainer` without importing the trainer's stack for every `import oxrl_core`
    if name == "Trainer":
        from oxrl_core.api import Trainer

        return Trainer
    raise AttributeError(f"module 'oxrl_core' has no attribute {name!r}")
