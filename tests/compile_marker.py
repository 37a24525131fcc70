"""Which tests compile: the `compile` marker, applied at collection (tests/conftest.py).

A test is marked `compile` when its function, a fixture it uses (its whole fixture
closure) or a class it is in can reach, through the calls written in the test files, one
of COMPILE_NAMES (cvmc's lowering, scheduling, building and compiling entry points),
`tvm.compile`, `tvm.build`, `cvmc.compile`, the string "compile" (the command line:
`main(["compile", ...])`, `cvmc compile` in a subprocess) or a string that names
`compile_model` (a script run in a subprocess). "Reach" follows, by name, the module's own
functions and classes and what it imports from `tests.*` modules (helpers such as
tests/oputil.check_op and tests/nnefutil.compile_and_run), transitively; cvmc's own
modules are not followed (only their entry points above count). It reads source, so
a new test file needs no marker of its own and nothing runs to decide; a test that
compiles through a path this cannot see (code run from a data file) takes
`@pytest.mark.compile` by hand.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

COMPILE_NAMES = frozenset({
    "compile_model", "lower_graph", "lower_kernel", "lower_node", "build_llvm", "build_cuda",
    "compile_kernel", "compile_kernel_json", "schedule_and_build", "schedule_llvm",
    "schedule_cpu", "schedule_cuda_module", "cuda_translation_unit", "nvcc_shared",
    # the benchmark scripts' (benchmarks/run.py, float_suite.py: loaded by path, not
    # followed) functions that compile and run a workload
    "measure", "run_benchmarks",
})
# a string (a script a test runs, a command line) that compiles
_COMPILING_TEXT = re.compile(r"\b(compile_model|cvmc compile|cvmc\.compile)\b")
# `X.compile` / `X.build` compile when X is one of these modules
COMPILING_MODULES = frozenset({"tvm", "cvmc"})
_HIT = "<compiles>"


class _Module:
    """A test file's top-level definitions: {name: names their bodies refer to}, and
    {local name: (module, name)} of what it imports from tests.* modules."""

    def __init__(self, path: Path):
        tree = ast.parse(path.read_text(), str(path))
        self.defs: dict[str, set] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}
        for node in tree.body:
            refs = _references(node, self.imports)  # imports inside functions too
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name] = refs
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):  # e.g. FAST = settings(...)
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        self.defs[t.id] = refs


def _references(node: ast.AST, imports: dict) -> set:
    """Names a definition refers to: plain names, `module.name` pairs, and _HIT where it
    names a compiling entry point itself; the imports in it go into `imports`."""
    out, markers = set(), set()
    for n in ast.walk(node):  # breadth first: a call before its arguments
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                n.func.attr in ("get_closest_marker", "iter_markers"):
            markers.update(id(a) for a in n.args)  # names the marker, compiles nothing
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            if isinstance(n.value, ast.Name):
                if n.value.id in COMPILING_MODULES and n.attr in ("compile", "build"):
                    out.add(_HIT)
                out.add((n.value.id, n.attr))
            out.add(n.attr)
        elif isinstance(n, ast.Constant) and id(n) not in markers:
            if isinstance(n.value, str) and (n.value == "compile"
                                             or _COMPILING_TEXT.search(n.value)):
                out.add(_HIT)
        elif isinstance(n, ast.ImportFrom):
            if n.module and n.level == 0:
                for alias in n.names:
                    imports[alias.asname or alias.name] = (n.module, alias.name)
                    out.add(alias.asname or alias.name)  # a function's own import
        elif isinstance(n, ast.Import):
            for alias in n.names:
                if alias.asname:
                    imports[alias.asname] = (alias.name, None)
    return out


@functools.cache
def _module(path: str) -> _Module | None:
    try:
        return _Module(Path(path))
    except (OSError, SyntaxError, ValueError):
        return None


@functools.cache
def _path_of(module: str) -> str | None:
    if module.split(".")[0] != "tests" or module == __name__:  # (this file names them all)
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec and spec.origin and spec.origin.endswith(".py") else None


_KNOWN: dict[tuple[str, str], bool] = {}


def compiles(path: str, name: str) -> bool:
    """Whether `name`, defined in or imported into the test file at `path`, can reach a
    compiling entry point."""
    if (path, name) not in _KNOWN:
        seen: set = set()
        found = _reaches(path, name, seen)
        if not found:  # nothing reachable from it compiles: none of what it reached does
            _KNOWN.update(dict.fromkeys(seen, False))
        _KNOWN[(path, name)] = found
    return _KNOWN[(path, name)]


def _reaches(path: str, name: str, seen: set) -> bool:
    """The depth-first search of `compiles`, visiting each (file, name) once."""
    if (path, name) in _KNOWN:
        return _KNOWN[(path, name)]
    if (path, name) in seen:
        return False
    seen.add((path, name))
    if name in COMPILE_NAMES or name == _HIT:
        return True
    m = _module(path)
    if m is None:
        return False
    if name in m.defs:
        for ref in m.defs[name]:
            if isinstance(ref, tuple):  # module.attr: a tests.* module imported by name
                base, attr = ref
                target = m.imports.get(base)
                mod = (f"{target[0]}.{target[1]}" if target and target[1] else
                       target[0] if target else None)
                other = _path_of(mod) if mod else None
                if other and _reaches(other, attr, seen):
                    return True
            elif _reaches(path, ref, seen):
                return True
        return False
    if name in m.imports:
        module, attr = m.imports[name]
        other = _path_of(module)
        return bool(other and attr and _reaches(other, attr, seen))
    return False


def _file(obj) -> str | None:
    try:
        return inspect.getsourcefile(inspect.unwrap(obj))
    except TypeError:
        return None


def item_compiles(item: pytest.Item) -> bool:
    """Whether the test `item` compiles (module docstring)."""
    path = str(item.path)
    if compiles(path, getattr(item, "originalname", item.name)):
        return True
    if getattr(item, "cls", None) is not None and compiles(path, item.cls.__name__):
        return True
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for fixturedef in (info.name2fixturedefs.get(name, ()) if info else ()):
            func = getattr(fixturedef, "func", None)
            where = _file(func) if func is not None else None
            if where and compiles(where, func.__name__):
                return True
    return False


def mark_compiling(items: list[pytest.Item]) -> None:
    """Add the `compile` marker to every item that compiles."""
    for item in items:
        if item.get_closest_marker("compile") is None and item_compiles(item):
            item.add_marker(pytest.mark.compile)
