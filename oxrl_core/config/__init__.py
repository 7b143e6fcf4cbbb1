"""Run configuration: schema (pydantic), YAML + dotted overrides, load-time checks."""

from pathlib import Path

from oxrl_core.config.load import load_config
from oxrl_core.config.schema import RLConfig, SLConfig


def load_sl_config(path: Path | None, overrides: list[str]) -> tuple[SLConfig, str]:
    """Validated SL config and the resolved model path; OxrlError on any mistake."""
    from oxrl_core.config.checks import check_config  # imports torch: not for every `oxrl --help`

    config = load_config(SLConfig, path, overrides)
    return config, check_config(config)


def load_rl_config(path: Path | None, overrides: list[str]) -> tuple[RLConfig, str]:
    from oxrl_core.config.checks import check_config

    config = load_config(RLConfig, path, overrides)
    return config, check_config(config)
