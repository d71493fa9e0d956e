"""No mutable state at module level: what a run changes belongs to the run's objects.

Every module and class body of the package is read (``if``/``try``/``with`` blocks
included). A value assigned there must be immutable: a constant, a tuple, a
frozenset, a :class:`types.MappingProxyType` over a literal, or the result of a
call known to give an immutable value. Locks, ``threading.local``, weak
dictionaries, caches (``functools.cache``/``lru_cache``) and augmented assignments
fail.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import numpy as np

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "scperteval"

#: Calls whose result is immutable (given immutable arguments, checked in turn).
IMMUTABLE_CALLS = frozenset(
    {
        "frozenset",
        "tuple",
        "MappingProxyType",
        "float",
        "int",
        "str",
        "min",
        "max",
        "math.sqrt",
        "re.compile",
        "TypeVar",
        "ctypes.POINTER",
        "Candidate",  # a frozen dataclass of strings and a function
    }
)
#: Literals allowed as the direct argument of these calls (the call freezes them).
FREEZING_CALLS = {"MappingProxyType": (ast.Dict,), "tuple": (ast.List, ast.GeneratorExp)}
FREEZING_CALLS["frozenset"] = (ast.Set, ast.List, ast.SetComp, ast.GeneratorExp)
#: Registries (``Registry(...)``) are filled by the decorators of their modules at
#: import; runs only read them. A user may register an entry of their own, before a
#: run, as an extension of the package: that is configuration, not a run's state.
REGISTRY_CALLS = frozenset({"Registry"})
#: ``numba.njit(...)(function)`` compiles a function at import, as the decorator does on a def.
COMPILING_CALLS = frozenset({"numba.njit"})
#: Module-level arrays built by a call of the module's own, checked below to be read-only.
FROZEN_ARRAYS = frozenset(
    {
        ("kernels/student_t.py", "LOG_RATIO_COEFFICIENTS"),
        ("kernels/student_t.py", "SERIES_COEFFICIENTS"),
    }
)
CACHE_DECORATORS = frozenset({"cache", "lru_cache", "functools.cache", "functools.lru_cache"})


def _called(node: ast.expr) -> str:
    function = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(function)


def _mutable(value: ast.expr) -> bool:
    """Whether the expression may build a mutable object (a conservative reading)."""
    if isinstance(value, ast.Tuple):
        return any(_mutable(element) for element in value.elts)
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        name = _called(value)
        if name in REGISTRY_CALLS:
            return False
        if isinstance(value.func, ast.Call) and _called(value.func) in COMPILING_CALLS:
            return False
        if name not in IMMUTABLE_CALLS:
            return True
        freezable = FREEZING_CALLS.get(name, ())
        arguments = [*value.args, *(keyword.value for keyword in value.keywords)]
        return any(
            _mutable_inside(argument) if isinstance(argument, freezable) else _mutable(argument)
            for argument in arguments
        )
    return False


def _mutable_inside(literal: ast.expr) -> bool:
    """Whether a literal that a call freezes holds a mutable value itself."""
    if isinstance(literal, ast.Dict):
        parts = [part for part in (*literal.keys, *literal.values) if part is not None]
    elif isinstance(literal, (ast.List, ast.Set)):
        parts = list(literal.elts)
    else:  # a comprehension: its element
        parts = [literal.elt]  # type: ignore[attr-defined]
    return any(_mutable(part) for part in parts)


def module_state(path: Path, root: Path = PACKAGE_ROOT) -> list[str]:
    """The module-level (and class-level) mutable state of one file, as readable lines."""
    relative = path.relative_to(root).as_posix()
    found: list[str] = []

    def visit(body: list[ast.stmt], in_class: bool) -> None:
        for node in body:
            where = f"{relative}:{node.lineno}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    if _called(decorator) in CACHE_DECORATORS:
                        found.append(f"{where} cache {node.name}")
            elif isinstance(node, ast.ClassDef):
                visit(node.body, True)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, []), in_class)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body, in_class)
            elif isinstance(node, ast.AugAssign):
                found.append(f"{where} {ast.unparse(node)}")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {ast.unparse(target) for target in targets}
                if names == {"__all__"}:
                    continue  # the import system's list of exports; nothing reads it at run time
                if {(relative, name) for name in names} <= FROZEN_ARRAYS:
                    continue
                if in_class and _called(node.value) == "field":
                    continue  # a dataclass field: each instance gets its own value
                if _mutable(node.value):
                    found.append(f"{where} {ast.unparse(node)[:80]}")

    visit(ast.parse(path.read_text(encoding="utf-8")).body, False)
    return found


def test_the_package_holds_no_mutable_module_state() -> None:
    found = [line for path in sorted(PACKAGE_ROOT.rglob("*.py")) for line in module_state(path)]
    assert found == []


def test_module_constants_built_by_a_call_are_read_only_arrays() -> None:
    for relative, name in sorted(FROZEN_ARRAYS):
        module = "scperteval." + relative.removesuffix(".py").replace("/", ".")
        value = getattr(importlib.import_module(module), name)
        assert isinstance(value, np.ndarray) and not value.flags.writeable, (module, name)


def test_the_scan_finds_each_kind_of_state(tmp_path: Path) -> None:
    package = tmp_path / "scperteval"
    package.mkdir()
    source = package / "state.py"
    source.write_text(
        "import functools, threading, weakref, re\n"
        "from types import MappingProxyType\n"
        "__all__ = ['f']\n"
        "LOCK = threading.Lock()\n"
        "LOCAL = threading.local()\n"
        "SESSIONS = weakref.WeakKeyDictionary()\n"
        "TABLE = {'a': 1}\n"
        "NAMES: list[str] = []\n"
        "if True:\n    SEEN = set()\n"
        "FROZEN = MappingProxyType({'a': (1, 2)})\n"
        "NESTED = MappingProxyType({'a': [1]})\n"
        "KINDS = frozenset({'x'})\n"
        "PATTERN = re.compile('x')\n"
        "COMPILED = numba.njit(inline='always')(len)\n"
        "BUILT = make_table()(len)\n"
        "COUNT = 0\n"
        "COUNT += 1\n"
        "class Holder:\n    cache = {}\n    name = 'x'\n"
        "@functools.lru_cache(maxsize=4)\ndef f(x):\n    return x\n"
        "@functools.cache\ndef g():\n    return 1\n",
        encoding="utf-8",
    )
    found = [line.split(" ", 1)[1].split(" ")[0] for line in module_state(source, package)]
    assert found == [
        "LOCK",
        "LOCAL",
        "SESSIONS",
        "TABLE",
        "NAMES:",
        "SEEN",
        "NESTED",
        "BUILT",
        "COUNT",
        "cache",
        "cache",
        "cache",
    ]
