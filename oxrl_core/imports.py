"""What a run names by a shipped name or as `module:attribute`: its reward function, its environment class."""

import importlib

from oxrl_core.errors import OxrlError


def shipped_or_imported(spec: str, shipped: dict, key: str, kind: str, names: list[str]) -> object:
    """`shipped[spec]`, or the attribute a `module:attribute` spec names; OxrlError naming `key` otherwise
    (`kind`: what it is, e.g. "reward"; `names`: the shipped names the message lists)."""
    if spec in shipped:
        return shipped[spec]
    if ":" not in spec:
        raise OxrlError(f"{key}={spec!r}: not a shipped {kind} ({', '.join(names)}) and not module:attribute")
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise OxrlError(f"{key}={spec!r}: cannot import ({e})") from None
