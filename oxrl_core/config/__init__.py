"""Run configuration: schema (pydantic), YAML + dotted overrides, load-time checks."""

from pathlib import Path

from oxrl_core.config.checks import check_config
from oxrl_core.config.load import load_config
from oxrl_core.config.schema import RLConfig, SLConfig
from oxrl_core.errors import OxrlError

BUILT_SL_ALGS = ("sft", "cpt", "kd", "dpo", "ipo", "simpo", "orpo", "rm", "kto", "rft", "spin", "online-dpo")


def load_sl_config(path: Path | None, overrides: list[str]) -> tuple[SLConfig, str]:
    """Validated SL config and the resolved model path; OxrlError on any mistake."""
    config = load_config(SLConfig, path, overrides)
    if config.train.alg not in BUILT_SL_ALGS:
        raise OxrlError(f"train.alg={config.train.alg!r}: not built yet (tracked in issue #4); built: {', '.join(BUILT_SL_ALGS)}")
    return config, check_config(config)


def load_rl_config(path: Path | None, overrides: list[str]) -> tuple[RLConfig, str]:
    config = load_config(RLConfig, path, overrides)
    return config, check_config(config)
