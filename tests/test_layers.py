"""The package's shape, checked on the source: no import cycles, every import goes down the
layers of docs/architecture.md (faces on top; kernels at the bottom), and no file past the
length the document allows.

Imports are read with ``ast`` (nothing is executed), wherever they are: at module level, inside
functions (deferred imports) and under ``if TYPE_CHECKING:`` (a type-only import is still a
dependency). Faces reach the layers below only through the loader and the generation API, with
no exception: a measurement of the internals lives in ``ds4mlx.diagnostics``, below the faces.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ds4mlx"

# Bottom to top; a unit may import its own layer or those below. A unit is a subpackage
# (``ds4mlx.engine``), a top-level module (``ds4mlx.loader``) or the package's own ``__init__``
# (``ds4mlx``, which re-exports ``load_model``).
LAYERS: list[tuple[str, frozenset[str]]] = [
    ("leaves", frozenset({"ds4mlx._blas", "ds4mlx.resources", "ds4mlx.memory"})),
    ("kernels", frozenset({"ds4mlx.kernels"})),
    ("gguf", frozenset({"ds4mlx.gguf"})),
    ("experts", frozenset({"ds4mlx.experts"})),
    ("models", frozenset({"ds4mlx.models"})),
    ("engine", frozenset({"ds4mlx.engine"})),
    ("distributed", frozenset({"ds4mlx.distributed"})),
    ("loader", frozenset({"ds4mlx.loader", "ds4mlx.load_plan", "ds4mlx"})),
    ("speculation", frozenset({"ds4mlx.speculation"})),
    ("generation", frozenset({"ds4mlx.generation"})),
    # Measurements of the internals (kernel benchmark, decode-graph profiler, distributed
    # probe): they must reach below the generation API, so they are not a face; faces run them.
    ("diagnostics", frozenset({"ds4mlx.diagnostics"})),
    ("faces", frozenset({"ds4mlx.cli", "ds4mlx.agent", "ds4mlx.server", "ds4mlx.bench"})),
]
LAYER_OF = {unit: rank for rank, (_, units) in enumerate(LAYERS) for unit in units}

# Which faces a face may import: ``cli`` holds the entry points of the others; the agent never
# imports the server (its HTTP backend is a client), nor the server the agent.
FACE_IMPORTS = {
    "ds4mlx.cli": {"ds4mlx.agent", "ds4mlx.server", "ds4mlx.bench"},
    "ds4mlx.agent": set(),
    "ds4mlx.server": set(),
    "ds4mlx.bench": set(),
}

# Faces talk to the layers below through the loader (``ds4mlx.loader``) and the generation API
# (``ds4mlx.generation``); they do not reach into these.
BELOW_THE_FACES = (
    "ds4mlx.kernels",
    "ds4mlx.gguf",
    "ds4mlx.experts",
    "ds4mlx.models",
    "ds4mlx.engine",
    "ds4mlx.distributed",
    "ds4mlx.speculation",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported ds4mlx module, line) for every import in ``module``'s source."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(
                    package[: len(package) - node.level + 1]
                    + ([node.module] if node.module else [])
                )
            else:
                base = node.module or ""
            # ``from package import module`` imports the module; ``from module import name``
            # the module.
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            if name == "ds4mlx" or name.startswith("ds4mlx."):
                while name not in MODULES:  # ``import ds4mlx.x.y`` of a name inside a module
                    name = name.rpartition(".")[0]
                yield name, node.lineno


def _unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


EDGES: dict[str, dict[str, int]] = defaultdict(dict)  # importer -> imported -> first line
for _module, _path in MODULES.items():
    for _target, _line in _imports(_module, _path):
        if _target != _module:
            EDGES[_module].setdefault(_target, _line)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
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
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _where(importer: str, imported: str) -> str:
    path = MODULES[importer].relative_to(PACKAGE.parent)
    return f"{path}:{EDGES[importer][imported]} imports {imported}"


def test_the_walk_sees_the_package():
    """Guards the walk itself: it finds the modules and resolves absolute, relative and
    ``from package import module`` imports."""
    assert {
        "ds4mlx.loader",
        "ds4mlx.engine.chat",
        "ds4mlx.engine.chat.base",
        "ds4mlx.experts.store",
        "ds4mlx.generation.service",
    } <= MODULES.keys()
    assert "ds4mlx.engine.chat.events" in EDGES["ds4mlx.engine.chat.base"]
    assert "ds4mlx.engine.chat.glm5" in EDGES["ds4mlx.engine.chat"]
    assert "ds4mlx.kernels" in EDGES["ds4mlx.models.moe"]
    assert "ds4mlx._blas" in EDGES["ds4mlx"]
    assert "ds4mlx.generation" in EDGES["ds4mlx.server.app"]


def test_no_import_cycle_between_modules():
    graph = {module: set(targets) for module, targets in EDGES.items()}
    cycles = _cycles(graph)
    assert not cycles, "modules importing each other: " + "; ".join(map(" <-> ".join, cycles))


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = defaultdict(set)
    for importer, targets in EDGES.items():
        graph[_unit(importer)] |= {_unit(t) for t in targets if _unit(t) != _unit(importer)}
    cycles = _cycles(graph)
    assert not cycles, "packages importing each other: " + "; ".join(map(" <-> ".join, cycles))


def test_every_package_has_a_layer():
    unplaced = {_unit(module) for module in MODULES} - LAYER_OF.keys()
    assert not unplaced, f"place {sorted(unplaced)} in LAYERS and in docs/architecture.md"


def test_imports_go_down_the_layers():
    upward = [
        _where(importer, imported)
        for importer, targets in EDGES.items()
        for imported in targets
        if LAYER_OF[_unit(imported)] > LAYER_OF[_unit(importer)]
    ]
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_faces_import_only_the_faces_they_may():
    wrong = [
        _where(importer, imported)
        for importer, targets in EDGES.items()
        if _unit(importer) in FACE_IMPORTS
        for imported in targets
        if _unit(imported) in FACE_IMPORTS
        and _unit(imported) != _unit(importer)
        and _unit(imported) not in FACE_IMPORTS[_unit(importer)]
    ]
    assert not wrong, "a face importing a face it may not:\n" + "\n".join(wrong)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _face_reaches() -> list[tuple[str, str]]:
    return [
        (importer, imported)
        for importer, targets in EDGES.items()
        if _unit(importer) in FACE_IMPORTS
        for imported in targets
        if any(_within(imported, below) for below in BELOW_THE_FACES)
    ]


def test_faces_do_not_reach_below_the_generation_api():
    reaches = [_where(importer, imported) for importer, imported in _face_reaches()]
    assert not reaches, (
        "faces reaching below the generation API (go through it, or through "
        "ds4mlx.diagnostics for a measurement of the internals):\n" + "\n".join(reaches)
    )


# docs/architecture.md: "Files stay under 700 lines. The one exception is an architecture file,
# allowed 900." (A file past it is read in more than one sitting; split it by concern.)
MAX_LINES = 700
ARCHITECTURE_FILES = {"models/deepseek4.py": 900, "models/glm5_next.py": 900}


def test_no_file_is_longer_than_the_rule_allows():
    too_long = {}
    for path in PACKAGE.rglob("*.py"):
        name = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > ARCHITECTURE_FILES.get(name, MAX_LINES):
            too_long[name] = lines
    assert not too_long, f"files past the length docs/architecture.md allows: {too_long}"
