"""Run configuration: the schema (pydantic; each algorithm's settings are declared in its own file), YAML and dotted
overrides. A run's checks and what it resolves to are `oxrl_core.resolve`."""

from oxrl_core.config.load import load_config

__all__ = ["load_config"]
