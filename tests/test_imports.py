"""Imports run one way, down the layers (docs/imports.md), and no two files import each other.

The layers, each importing only those below it:

    cvmc (the public API)
    cli
    quantize          (float models to CVM integer models)
    builder
    frontend          codegen
         \\            lowering
          \\          /
           passes
           reference
           ops
           ir
           errors

frontend never imports lowering or codegen, codegen never imports frontend. Every import
counts, the ones inside functions too (they run as well, only later). cvmc uses the
runtime through its public API (`from cvmc_runtime import X`), and the runtime imports
nothing from cvmc. No file imports another file's private (`_`-prefixed) names: what files
share is public and documented. `docs/imports.md` draws the graph this test walks.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BELOW = {
    "errors": set(),
    "ir": {"errors"},
    "ops": {"ir", "errors"},
    "reference": {"ops", "ir", "errors"},
    "passes": {"reference", "ops", "ir", "errors"},
    "lowering": {"passes", "reference", "ops", "ir", "errors"},
    "codegen": {"lowering", "passes", "reference", "ops", "ir", "errors"},
    "frontend": {"passes", "reference", "ops", "ir", "errors"},
    "builder": {"frontend", "passes", "reference", "ops", "ir", "errors"},
    "quantize": {"builder", "frontend", "passes", "reference", "ops", "ir", "errors"},
    "cli": {"quantize", "builder", "frontend", "codegen", "lowering", "passes", "reference", "ops", "ir",
            "errors"},
}


def _module(path: Path, package_root: Path) -> str:
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    """Every module `path` imports (absolute names; relative imports resolved)."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # `from cvmc.ops import te` imports the module cvmc.ops.te where there is one
            # (`_graph` keeps the names that are modules)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _files(package: str) -> dict[str, Path]:
    """module -> file, for every module of `package` (cvmc or cvmc_runtime)."""
    root = ROOT / ("runtime" if package == "cvmc_runtime" else "") / package
    return {_module(p, root): p for p in root.rglob("*.py")}


KNOWN = {*_files("cvmc"), *_files("cvmc_runtime")}


def _graph(package: str) -> dict[str, set[str]]:
    """module -> the modules it imports (of cvmc and the runtime: those that exist; others
    as named)."""
    return {m: {t for t in _imports(p, m) if t in KNOWN or not t.startswith("cvmc")}
            for m, p in _files(package).items()}


def _layer(module: str) -> str | None:
    """The layer of a cvmc module: its subpackage or top-level module (None: the API)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_layers_import_only_downward():
    cvmc = _graph("cvmc")
    up = []
    for module, imported in sorted(cvmc.items()):
        layer = _layer(module)
        for target in sorted(imported):
            if target in cvmc:
                other = _layer(target)
                if layer is not None and other != layer and (
                        other is None or other not in BELOW[layer]):
                    up.append(f"{module} -> {target}")
    assert not up, "imports that run up the layers:\n  " + "\n  ".join(up)


def test_cvmc_uses_the_public_runtime_api_and_the_runtime_imports_no_cvmc():
    internal = [f"{m} -> {t}" for m, ts in sorted(_graph("cvmc").items()) for t in sorted(ts)
                if t.startswith("cvmc_runtime.")]
    assert not internal, "cvmc imports runtime internals:\n  " + "\n  ".join(internal)
    back = [f"{m} -> {t}" for m, ts in sorted(_graph("cvmc_runtime").items())
            for t in sorted(ts) if t == "cvmc" or t.startswith("cvmc.")]
    assert not back, "the runtime imports cvmc:\n  " + "\n  ".join(back)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    edges = {m: sorted(t for t in ts if t in graph and t != m) for m, ts in graph.items()}
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
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
                        out.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def test_no_import_circles_between_files():
    circles = _circles(_graph("cvmc")) + _circles(_graph("cvmc_runtime"))
    assert not circles, "files that import each other:\n  " + "\n  ".join(
        " <-> ".join(c) for c in circles)


def _private_imports(path: Path) -> list[str]:
    """`line: from module import _name` for each private name `path` imports from cvmc or
    the runtime, relative imports included (dunder names such as `__version__` are
    public)."""
    return [f"{node.lineno}: from {'.' * node.level}{node.module or ''} import {alias.name}"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").split(".")[0] in ("cvmc", "cvmc_runtime"))
            for alias in node.names
            if alias.name.startswith("_") and not alias.name.startswith("__")]


def test_no_file_imports_another_files_private_names():
    found = [f"{path.relative_to(ROOT)}:{line}"
             for package in ("cvmc", "cvmc_runtime") for path in sorted(_files(package).values())
             for line in _private_imports(path)]
    assert not found, "imports of another file's private names:\n  " + "\n  ".join(found)


def test_the_private_import_check_sees_one(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from cvmc.ops.nn import _hidden, public\nfrom cvmc import __version__\n"
                      "from numpy import _private\nfrom .sibling import _near\n")
    assert _private_imports(source) == ["1: from cvmc.ops.nn import _hidden",
                                        "4: from .sibling import _near"]


def test_the_checks_see_an_arrow_up_and_a_circle():
    """The walker itself: a hand-made graph with one arrow up and one circle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _layer("cvmc.ops.nn") == "ops" and "lowering" not in BELOW["ops"]
