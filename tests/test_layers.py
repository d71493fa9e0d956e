"""The package's import graph: no cycles, no import from a lower layer to a higher one,
and no import of another package's private names.

Every ``import`` statement counts, wherever it stands: at module level, inside a
function, or under ``if TYPE_CHECKING``. A module may import its own layer and
the layers below it.

A name or module whose name starts with an underscore (``_common``, ``_centred``)
is private to the package that holds it: only modules of that package and of its
subpackages may import it. ``scperteval.metrics._common`` may be imported by
``scperteval.metrics.population`` but not by ``scperteval.engine.spaces``; a private
name of ``scperteval.kernels.rbf`` by ``scperteval.kernels.sinkhorn`` but not by
``scperteval.metrics``. The root package's private modules (``scperteval._version``,
``scperteval._memo``) are therefore the foundation every
module may use, as every module lies in the root package. Other libraries' private
names are never imported.
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
    ("splits", ("scperteval.splits",)),
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


def imported_names(own: str, path: Path) -> list[tuple[str, str]]:
    """``(stem, dotted name)`` of everything module ``own`` (at ``path``) imports anywhere.

    ``import a.b`` gives ``("a.b", "a.b")``; ``from a.b import c`` gives
    ``("a.b", "a.b.c")``, relative imports resolved.
    """
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    names: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.extend((alias.name, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names.extend((stem, f"{stem}.{alias.name}") for alias in node.names)
    return names


def imported_modules(own: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that module ``own`` (at ``path``) imports anywhere."""
    found: set[str] = set()
    for stem, name in imported_names(own, path):
        # ``from package import module`` imports the module; otherwise the stem.
        target = name if name in modules else stem
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


def private_imports(root: Path = PACKAGE_ROOT) -> list[str]:
    """Imports of a private name or module from outside the package that holds it."""
    modules = package_modules(root)
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    problems = []
    for own, path in sorted(modules.items()):
        for _, name in imported_names(own, path):
            parts = name.split(".")
            private = [i for i, part in enumerate(parts) if part.startswith("_")]
            private = [i for i in private if not parts[i].startswith("__")]
            if not private:
                continue
            holder = ".".join(parts[: private[0]])
            if parts[0] != root.name:
                problems.append(f"{own} imports {name}, private to another library")
                continue
            # The holder is a module or a package; a module's names belong to its package.
            while holder not in packages and "." in holder:
                holder = holder.rpartition(".")[0]
            if own != holder and not own.startswith(holder + "."):
                problems.append(f"{own} imports {name}, private to {holder}")
    return problems


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = [name for name in package_modules() if layer_of(name) < 0]
    assert unplaced == []


def test_no_import_cycles() -> None:
    assert find_cycle(import_graph()) is None


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    assert upward_imports(import_graph()) == []


def test_no_import_of_another_packages_private_names() -> None:
    assert private_imports() == []


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


def test_the_private_check_knows_whose_names_are_whose(tmp_path: Path) -> None:
    files = {
        "scperteval/__init__.py": "from scperteval._memo import memo\n",
        "scperteval/_memo.py": "",
        "scperteval/metrics/__init__.py": "from . import _common\n",
        "scperteval/metrics/_common.py": "",
        "scperteval/metrics/population.py": (
            "from scperteval.metrics._common import _check\nfrom scperteval._memo import memo\n"
        ),
        "scperteval/metrics/sub/__init__.py": "from scperteval.metrics.population import _x\n",
        "scperteval/engine/__init__.py": "",
        "scperteval/engine/spaces.py": (
            "from scperteval.metrics._common import Degenerate\n"
            "from scperteval.metrics import population\n"
            "def f():\n    from scperteval.metrics.population import _centred\n"
            "    import numpy._core\n"
        ),
    }
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert private_imports(tmp_path / "scperteval") == [
        "scperteval.engine.spaces imports scperteval.metrics._common.Degenerate, "
        "private to scperteval.metrics",
        "scperteval.engine.spaces imports scperteval.metrics.population._centred, "
        "private to scperteval.metrics",
        "scperteval.engine.spaces imports numpy._core, private to another library",
    ]


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
