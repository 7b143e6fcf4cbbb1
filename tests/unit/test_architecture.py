"""The package's shape: rooms in layers, imports only pointing down, no cycles, and tests that use public names.

Read from the source with `ast` (nothing is imported): every `import` and `from ... import` of oxrl_core or oxrl_cli
anywhere in a module, at its top or inside a function, is an edge of the import graph. A room is a top-level entry
of oxrl_core (a subpackage or a module), or oxrl_cli; the package root `oxrl_core/__init__.py` is a room of its own.
"""

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("oxrl_cli", "oxrl_core")
ROOT = "oxrl_core"  # the package root's room: oxrl_core/__init__.py alone

# Top to bottom: a room may import the rooms of the layers below its own, and itself.
LAYERS: list[tuple[str, ...]] = [
    ("oxrl_cli",),
    (ROOT, "oxrl_core.api", "oxrl_core.demo"),
    ("oxrl_core.doctor", "oxrl_core.model_registry"),  # commands that run the loops
    ("oxrl_core.loops",),
    ("oxrl_core.resolve",),  # a config -> a resolved run, directly below the loops that run it
    ("oxrl_core.evaluation", "oxrl_core.preprocess"),
    ("oxrl_core.rewards",),
    ("oxrl_core.rollout",),
    ("oxrl_core.training",),
    ("oxrl_core.weights",),  # the weights' way from the trainer ranks to the engines, below both sides
    ("oxrl_core.data",),
    ("oxrl_core.envs",),
    ("oxrl_core.cluster",),
    ("oxrl_core.config",),
    ("oxrl_core.algs",),
    ("oxrl_core.models", "oxrl_core.tracking", "oxrl_core.imports"),
    (
        "oxrl_core.errors",
        "oxrl_core.version",
    ),  # import nothing; the version sits below tracking, whose reports print it
]
LAYER = {room: depth for depth, rooms in enumerate(LAYERS) for room in rooms}
# The package root re-exports (`from oxrl_core import Trainer`, lazily): it may import the rooms of its own layer.
RE_EXPORTS_OWN_LAYER = {ROOT}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (a name imported from a package is its submodule when it is one)
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}: {self.source} -> {self.target}"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))}


def imported_modules(node: ast.AST, source: str, is_package: bool, known: dict[str, Path]) -> list[str]:
    """The modules of oxrl_core or oxrl_cli that one import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the importing module's package, up level - 1 more
        package = source.split(".") if is_package else source.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def imports(sources: dict[str, Path] | None = None) -> list[Import]:
    """The import graph's edges out of `sources` (module name -> file; default: the packages' modules)."""
    known = modules()
    found = []
    for source, path in (known if sources is None else sources).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            for target in imported_modules(node, source, path.name == "__init__.py", known):
                if target.split(".")[0] in PACKAGES and target != source:
                    found.append(Import(source, target, path, node.lineno))
    return found


def room(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] != "oxrl_core" or len(parts) == 1 else ".".join(parts[:2])


def test_every_room_of_the_package_has_a_layer():
    """A new subpackage or top-level module of oxrl_core must be placed in LAYERS before it is used."""
    entries = {
        f"oxrl_core.{p.stem}"
        for p in (REPO / "oxrl_core").iterdir()
        if (p.is_dir() and any(p.rglob("*.py"))) or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert sorted(entries - LAYER.keys()) == []
    assert sorted(room(m) for m in modules() if room(m) not in LAYER) == []


def test_every_imported_module_of_the_package_exists():
    """An import inside a function runs only when the function does, and a benchmark only when it is run: one left
    naming a moved module would fail late."""
    known = modules()
    scripts = {
        module_name(path): path for folder in ("tests", "benchmarks") for path in sorted((REPO / folder).rglob("*.py"))
    }
    missing = [str(edge) for edge in imports() + imports(scripts) if edge.target not in known]
    assert missing == [], "imports of modules that do not exist:\n" + "\n".join(missing)


def test_every_import_between_rooms_points_to_a_lower_layer():
    upward = []
    for edge in imports():
        source, target = room(edge.source), room(edge.target)
        if source == target or target not in LAYER or source not in LAYER:
            continue  # a room without a layer fails the test above
        lowest_allowed = LAYER[source] if source in RE_EXPORTS_OWN_LAYER else LAYER[source] + 1
        if LAYER[target] < lowest_allowed:
            upward.append(f"{edge} (layer {LAYER[source]} imports layer {LAYER[target]})")
    assert upward == [], "imports that do not point down:\n" + "\n".join(upward)


def test_the_cluster_places_counts_and_reads_no_run_config():
    """`oxrl_core.cluster` decides from a `PlacementRequest` (the loops build it from the config): it imports neither
    the config nor the algorithms, though both sit below it."""
    reads = [
        str(edge)
        for edge in imports()
        if room(edge.source) == "oxrl_core.cluster" and room(edge.target) in ("oxrl_core.config", "oxrl_core.algs")
    ]
    assert reads == []


def test_no_module_imports_itself_through_others():
    """No cycle in the module graph, counting imports inside functions (a cycle dodged by a late import is one)."""
    edges: dict[str, dict[str, Import]] = {}
    for edge in imports():
        edges.setdefault(edge.source, {}).setdefault(edge.target, edge)
    cycles = [cycle for cycle in strongly_connected(edges) if len(cycle) > 1]
    described = []
    for component in cycles:
        path = a_cycle(component, edges)
        described.append(
            f"{' -> '.join(path)} (one cycle of {', '.join(component)})\n"
            + "\n".join(f"    {edges[a][b]}" for a, b in zip(path, path[1:]))
        )
    assert described == [], "import cycles:\n" + "\n".join(described)


def strongly_connected(edges: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    nodes = sorted(set(edges) | {t for targets in edges.values() for t in targets})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def a_cycle(component: list[str], edges: dict[str, dict[str, Import]]) -> list[str]:
    """One cycle through the component's first module (breadth first: a shortest one), as its modules in order."""
    inside, start = set(component), component[0]
    came_from = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges.get(node, {})):
                if child == start:
                    path = [node]
                    while came_from[path[-1]] is not None:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child in inside and child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return component


def test_tests_and_benchmarks_import_only_public_names_of_oxrl_core():
    """A name starting with `_` is the module's own: what tests and benchmarks need is made public."""
    private = []
    for folder in ("tests", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "oxrl_core":
                    private += [
                        f"{path.relative_to(REPO)}:{node.lineno}: from {node.module} import {alias.name}"
                        for alias in node.names
                        if alias.name.startswith("_")
                        and not (alias.name.startswith("__") and alias.name.endswith("__"))
                    ]
    assert private == [], "private names imported:\n" + "\n".join(private)


def test_the_loops_read_in_short_functions_without_shared_mutable_closures():
    """No function in loops/ over 80 lines, and none that rebinds a variable of the function around it (`nonlocal`):
    a step's state lives on its recipe, where it is named."""
    long, rebinding = [], []
    for path in sorted((REPO / "oxrl_core" / "loops").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{where} {node.name}: {node.end_lineno - node.lineno + 1} lines")
            if isinstance(node, ast.Nonlocal):
                rebinding.append(f"{where} nonlocal {', '.join(node.names)}")
    assert long == [] and rebinding == [], long + rebinding


def _shared_fields(model, prefix: str) -> dict[str, str]:
    """{dotted key: description} of every field of a config's shared sections: all but the algorithms' blocks."""
    from pydantic import BaseModel

    fields = {}
    for name, field in model.model_fields.items():
        if field.alias is not None:  # an algorithm's own block, train.<alg>
            continue
        key = f"{prefix}.{name}" if prefix else name
        nested = [
            a
            for a in (field.annotation, *getattr(field.annotation, "__args__", ()))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        fields[key] = field.description or ""
        for sub in nested:
            fields |= _shared_fields(sub, key)
    return fields


def test_the_shared_config_holds_no_algorithms_setting():
    """An algorithm's setting is a field of its own settings class (its `train.<alg>` block), never of the sections
    every run shares: no shared `train` key is any algorithm's setting, and no shared key's meaning is written for some
    algorithms only ("SimPO: ...", the flat schema's style)."""
    import re

    from oxrl_core.algs.registry import ALGORITHMS
    from oxrl_core.config.schema import RLConfig, SLConfig

    shared = {
        k: v
        for config in (SLConfig, RLConfig)
        for section, field in config.model_fields.items()
        for k, v in _shared_fields(field.annotation, section).items()
    }
    settings = {key for record in ALGORITHMS.values() for key in record.settings.model_fields}
    assert sorted(k for k in shared if k.startswith("train.") and k.rsplit(".", 1)[-1] in settings) == []
    names = {n.upper() for n in ALGORITHMS} | {"SimPO", "Online DPO", "Dr. GRPO", "GSPO-token"}
    for_some = re.compile("(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(, [\w .+-]+)*:")
    assert sorted(k for k, meaning in shared.items() if for_some.search(meaning)) == []
    assert for_some.search("SimPO: target reward margin.") and for_some.search("RFT, SPIN: rounds.")


def test_the_rank_side_code_never_looks_an_algorithm_up_by_name():
    """The trainer ranks get the algorithm's loss with their call, not a name to look up in the registry again."""
    training = [p for p in (REPO / "oxrl_core" / "training").rglob("*.py")]
    uses = [
        f"{p.relative_to(REPO)}:{node.lineno}"
        for p in training
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.Name, ast.Attribute))
        and getattr(node, "id", getattr(node, "attr", None)) == "ALGORITHMS"
    ]
    assert uses == []


def test_the_loops_never_look_an_algorithm_up():
    """A run's algorithm is looked up once, when it is resolved (`oxrl_core/resolve/run.py`); the loops get its
    record with the run."""
    found = [
        str(i) for i in imports() if i.source.startswith("oxrl_core.loops") and i.target == "oxrl_core.algs.registry"
    ]
    assert found == []


def test_importing_a_package_changes_nothing():
    """A package's `__init__.py` holds its docstring, imports, constants and functions: no statement that acts (sets
    the environment, starts anything) on `import`."""
    acting = []
    for path in sorted(p for package in PACKAGES for p in (REPO / package).rglob("__init__.py")):
        for node in ast.parse(path.read_text()).body:
            docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            constant = isinstance(node, (ast.Assign, ast.AnnAssign)) and not any(
                isinstance(n, ast.Call) for n in ast.walk(node)
            )
            if not (docstring or constant or isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef))):
                acting.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert acting == []
