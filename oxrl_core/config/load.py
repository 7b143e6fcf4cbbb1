"""YAML loading, dotted overrides and the conversion of validation errors to one line."""

import re
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from oxrl_core.errors import OxrlError


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-5` as a float (YAML 1.1 wants `1.0e-5`) and refuses a key given twice
    in one mapping (plain YAML keeps the later one silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *anchor` keys are overridden by the mapping's own, as YAML intends
                key = self.construct_object(key_node, deep=True)
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice (first on line {first_line[key]})", key_node.start_mark
                    )
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*)?\.?\d*[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def parse_yaml(text: str, source: str):
    try:
        return yaml.load(text, Loader=_YamlLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise OxrlError(f"{where}: not valid YAML ({getattr(e, 'problem', e)})") from None


def apply_override(tree: dict, override: str) -> None:
    """Apply `a.b.c=value` in place; the value is parsed as YAML (numbers, bools, lists)."""
    key, sep, raw = override.partition("=")
    if not sep or not key:
        raise OxrlError(f"override {override!r}: expected KEY=VALUE with a dotted key, e.g. train.lr=2e-5")
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        node = _child(node, part, ".".join(parts[: i + 1]))
    last = parts[-1]
    value = parse_yaml(raw, f"override {override!r}")
    if isinstance(node, list):
        node[_list_index(node, last, key)] = value
    else:
        node[last] = value


def _child(node, part: str, path: str):
    if isinstance(node, list):
        return node[_list_index(node, part, path)]
    if not isinstance(node, dict):
        raise OxrlError(f"override key {path!r}: {type(node).__name__} value has no sub-keys")
    return node.setdefault(part, {})


def _list_index(node: list, part: str, path: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise OxrlError(f"override key {path!r}: index {part!r} is not in 0..{len(node) - 1}")
    return int(part)


Config = TypeVar("Config", bound=BaseModel)


def load_config(schema: type[Config], path: Path | None, overrides: list[str]) -> Config:
    """Read YAML (or start empty), apply overrides, validate against `schema`."""
    tree = read_tree(path)
    for override in overrides:
        apply_override(tree, override)
    return validate(schema, tree)


def read_tree(path: Path | None) -> dict:
    """A config file's sections as a dict, unvalidated ({} without a file)."""
    if path is None:
        return {}
    if not path.is_file():
        raise OxrlError(f"--config {path}: no such file")
    tree = parse_yaml(path.read_text(), str(path)) or {}
    if not isinstance(tree, dict):
        raise OxrlError(
            f"{path}: the top level must be a mapping of sections (model, data, train, ...), got {type(tree).__name__}"
        )
    return tree


def validate(schema: type[Config], tree: dict) -> Config:
    """A config tree (sections of keys) checked against `schema`; every mistake named in one OxrlError."""
    try:
        return schema.model_validate(tree)
    except ValidationError as e:
        raise OxrlError("invalid config: " + "; ".join(_describe(err, schema) for err in e.errors())) from None


def _describe(err: dict, schema: type[BaseModel]) -> str:
    key = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        model = _model_at(schema, err["loc"][:-1])
        why = _why_not(model, str(err["loc"][-1]))
        allowed = ", ".join(field.alias or name for name, field in model.model_fields.items())
        return f"unknown key {key!r}{f' ({why})' if why else ''} (allowed here: {allowed})"
    if err["type"] == "missing":
        return f"{key}: required key is missing"
    return f"{key}={err['input']!r}: {err['msg']}"


def _model_at(schema: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The (nested) model at `loc`, whose keys are field names or aliases (an algorithm's block: `train.dr-grpo`)."""
    model = schema
    for part in loc:
        if isinstance(part, int):
            continue
        field = next(f for name, f in model.model_fields.items() if part in (name, f.alias))
        annotation = field.annotation
        model = next(
            (a for a in getattr(annotation, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)),
            annotation,
        )
    return model


def _why_not(model: type[BaseModel], key: str) -> str | None:
    """Why an algorithm's settings have no such key: its definition fixes it, or other algorithms take it."""
    from oxrl_core.algs.registry import taking
    from oxrl_core.algs.settings import Settings

    if not issubclass(model, Settings):
        return None
    if key in model.fixed:
        return model.fixed[key]
    takers = taking(key)
    return f"a setting of --alg {', '.join(takers)}" if takers else None


def dump_config(config: BaseModel) -> str:
    """The resolved config as YAML; `load_config` of this text gives the same config."""
    return yaml.safe_dump(config.model_dump(mode="json", by_alias=True), sort_keys=False)
