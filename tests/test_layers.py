"""The package's import graph: no cycles, and no import from a lower layer to a higher one.

Every ``import`` statement counts, wherever it stands: at module level, inside a
function, or under ``if TYPE_CHECKING``. A module may import its own layer and
the layers below it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "scperteval"

#: The layers from the bottom up; a module belongs to the layer of its longest prefix.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "scperteval._version",
            "scperteval.errors",
            "scperteval.registry",
            "scperteval.progress",
            "scperteval.runinfo",
            "scperteval.outputs",
            "scperteval._memo",
            "scperteval.suites",
        ),
    ),
    ("kernels", ("scperteval.kernels",)),
    ("data", ("scperteval.data",)),
    ("simulation", ("scperteval.simulation",)),
    ("stats", ("scperteval.stats",)),
    ("metrics", ("scperteval.metrics",)),
    ("context", ("scperteval.context",)),
    ("torch_backend", ("scperteval.torch_backend",)),
    ("engine", ("scperteval.engine",)),
    ("distances", ("scperteval.distances",)),
    ("reporting", ("scperteval.reporting",)),
    ("scoring", ("scperteval.scoring",)),
    ("training", ("scperteval.torch_backend.training",)),
    ("workflows", ("scperteval.workflows",)),
    ("cli", ("scperteval.cli",)),
    ("package", ("scperteval",)),
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(root: Path = PACKAGE_ROOT) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def imported_modules(own: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that module ``own`` (at ``path``) imports anywhere."""
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # ``from package import module`` imports the module; otherwise the stem.
            targets = [
                f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            # ``import a.b.c`` imports the packages above it too; the deepest known one counts.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != own:
                found.add(target)
    return found


def layer_of(module: str) -> int:
    best, best_length = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    return best


def import_graph(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    modules = package_modules(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a list of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(module):
                problems.append(
                    f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
                    f"({LAYERS[layer_of(target)][0]})"
                )
    return problems


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = [name for name in package_modules() if layer_of(name) < 0]
    assert unplaced == []


def test_no_import_cycles() -> None:
    assert find_cycle(import_graph()) is None


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    assert upward_imports(import_graph()) == []


def test_top_level_holds_few_modules() -> None:
    top = {path.stem for path in PACKAGE_ROOT.glob("*.py")} - {"__init__", "_version"}
    assert len(top) <= 8, sorted(top)


def test_no_two_modules_share_an_entry_point_name() -> None:
    names = [path.name for path in PACKAGE_ROOT.rglob("api.py")]
    assert len(names) <= 1


# The checks themselves, on a small package written for the purpose.


def _graph(root: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return import_graph(root / "scperteval")


def test_the_walk_sees_type_only_and_function_level_imports(tmp_path: Path) -> None:
    graph = _graph(
        tmp_path,
        {
            "scperteval/__init__.py": "",
            "scperteval/errors.py": "",
            "scperteval/data/__init__.py": "",
            "scperteval/data/dataset.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from scperteval.context import Context\n"
                "def f():\n    import scperteval.engine.engine\n"
            ),
            "scperteval/context.py": "from scperteval.data import dataset\n",
            "scperteval/engine/__init__.py": "",
            "scperteval/engine/engine.py": "from .. import errors\n",
        },
    )
    assert graph["scperteval.data.dataset"] == {"scperteval.context", "scperteval.engine.engine"}
    assert graph["scperteval.context"] == {"scperteval.data.dataset"}
    assert graph["scperteval.engine.engine"] == {"scperteval.errors"}
    assert find_cycle(graph) == [
        "scperteval.context",
        "scperteval.data.dataset",
        "scperteval.context",
    ]
    problems = upward_imports(graph)
    assert "scperteval.data.dataset (data) imports scperteval.context (context)" in problems
    assert "scperteval.data.dataset (data) imports scperteval.engine.engine (engine)" in problems


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("scperteval", "package"),
        ("scperteval.errors", "foundation"),
        ("scperteval.kernels.rbf", "kernels"),
        ("scperteval.stats.groups", "stats"),
        ("scperteval.workflows.score", "workflows"),
        ("scperteval.cli._score", "cli"),
    ],
)
def test_layer_of_uses_the_longest_prefix(module: str, layer: str) -> None:
    assert LAYERS[layer_of(module)][0] == layer
