"""Run configuration: schema (pydantic), YAML + dotted overrides. The checks at load, which need the rooms above
this one, are `oxrl_core.loops.preflight` (`load_sl_config`, `load_rl_config`)."""

from oxrl_core.config.load import load_config

__all__ = ["load_config"]
