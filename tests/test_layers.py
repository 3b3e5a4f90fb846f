"""The codebase's spine, as DESIGN states it: policies <- storage <- gateway, nothing upward.

Read from the source (every import statement, at any depth, by `ast`), so a lazy import inside a
function counts too:
- `policies/` imports neither `storage` nor `gateway`; `storage/` does not import `gateway`;
- nothing shipped (`gateway`, `policies`, `storage`) or run by CI (`scripts`) imports `tests` or the test
  support package `testkit`; the benchmarks (`bench`) may import `testkit`, never `tests`;
- LiteLLM is imported only in `gateway/upstream/litellm_client/`;
- the layout shows the way: at most 12 modules at `gateway/`'s top, the rest in folders;
- no code outside `gateway/wire/` asks which wire format class it holds (`isinstance(x, AnthropicMessages)`):
  what differs between formats is a capability of the format (`WireFormat.adds_tools_midway`,
  `marks_cache`...);
- no import circles among the modules of `policies/`, `storage/` and `gateway/` (imports under
  TYPE_CHECKING and inside functions count: a circle hidden so is still one to read through);
- memoisation goes through one helper: no module but `policies/memo.py` uses `functools.lru_cache` or
  `functools.cache` (however imported), so `reset_memos()` reaches every memo;
- the shipped packages keep to small modules and functions (CONVENTIONS: a module never passes 450
  lines, a function fits on a screen).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WIRE_CLASSES = {"AnthropicMessages", "OpenAIChat", "OpenAIResponses"}
SHIPPED = ("gateway", "policies", "storage")


def _modules(package: str) -> list[Path]:
    """The package's own modules: not caches, nor what lives in hidden folders (the LiteLLM Proxy venv
    bench/proxy_compare.py installs at bench/.litellm-proxy-venv)."""
    root = REPO / package
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def _imported(path: Path) -> set[str]:
    """The top-level packages a module imports (absolute imports; relative ones stay in its package)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize(("package", "forbidden"), [("policies", {"storage", "gateway", "tests", "testkit"}),
                                                    ("storage", {"gateway", "tests", "testkit"}),
                                                    ("gateway", {"tests", "testkit"}),
                                                    ("scripts", {"tests", "testkit"}),
                                                    ("bench", {"tests"}),
                                                    ("testkit", {"tests"})])
def test_no_package_imports_upward(package: str, forbidden: set[str]) -> None:
    upward = {_name(p): sorted(_imported(p) & forbidden) for p in _modules(package)}
    assert {name: found for name, found in upward.items() if found} == {}


def test_litellm_is_imported_in_its_folder_only() -> None:
    folder = REPO / "gateway" / "upstream" / "litellm_client"
    importers = [p for p in [*_modules("gateway"), *_modules("policies"), *_modules("storage")]
                 if "litellm" in _imported(p)]
    assert importers and [_name(p) for p in importers if folder not in p.parents] == []


def test_the_gateway_top_holds_at_most_twelve_modules() -> None:
    top = sorted(p.name for p in (REPO / "gateway").glob("*.py"))
    assert len(top) <= 12, top


def test_no_code_outside_the_wire_folder_asks_a_formats_class() -> None:
    asked = []
    for path in [*_modules("gateway"), *_modules("policies"), *_modules("storage")]:
        if (REPO / "gateway" / "wire") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                    and len(node.args) == 2 and WIRE_CLASSES & {n.id for n in ast.walk(node.args[1])
                                                                if isinstance(n, ast.Name)}:
                asked.append(f"{_name(path)}:{node.lineno}")
    assert asked == []


def _direct_memos(path: Path) -> list[int]:
    """The lines where a module names `functools.lru_cache` / `functools.cache` (as an attribute or
    imported by name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in {"lru_cache", "cache"} \
                and isinstance(node.value, ast.Name) and node.value.id == "functools":
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "functools" \
                and {"lru_cache", "cache"} & {alias.name for alias in node.names}:
            found.append(node.lineno)
    return sorted(found)


def test_memoisation_goes_through_policies_memo() -> None:
    helper = REPO / "policies" / "memo.py"
    assert _direct_memos(helper)  # the check sees the one use it allows
    assert [f"{_name(p)}:{line}" for pkg in SHIPPED for p in _modules(pkg) if p != helper
            for line in _direct_memos(p)] == []


def test_no_module_is_over_450_lines() -> None:
    long = {_name(p): n for pkg in SHIPPED for p in _modules(pkg) if (n := len(p.read_text().splitlines())) > 450}
    assert long == {}


def test_no_function_is_over_80_lines() -> None:
    """Nested functions count within the function that holds them. Migrations (storage/migrations/) are left
    out: a migration's upgrade() is a listing of the schema's tables and columns, read top to bottom, not
    logic that reads better in parts."""
    migrations = REPO / "storage" / "migrations"
    long = {}
    for path in [p for pkg in SHIPPED for p in _modules(pkg) if migrations not in p.parents]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long[f"{_name(path)}:{node.lineno} {node.name}"] = node.end_lineno - node.lineno + 1
    assert long == {}


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports, from every import statement at any depth (under
    TYPE_CHECKING, inside functions). `from a import b` imports `a.b` when that is a module, else `a`;
    relative imports are resolved from the module's package."""
    paths = {_module_name(root, p): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))
             if "__pycache__" not in p.parts}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in paths)
            elif isinstance(node, ast.ImportFrom):
                base = ".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])]) \
                    if node.level else str(node.module)
                for alias in node.names:
                    if f"{base}.{alias.name}" in paths:
                        found.add(f"{base}.{alias.name}")
                    elif base in paths:
                        found.add(base)
        graph[name] = found - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return out


def test_no_import_cycles() -> None:
    graph = _import_graph(REPO, SHIPPED)
    assert "policies.assembler" in graph and _cycles(graph) == []


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The readers above find a lazy import and a relative one as they should, and a circle closed only
    under TYPE_CHECKING and inside a function."""
    module = tmp_path / "m.py"
    module.write_text("import os.path\ndef f():\n    from gateway.wire import x\n    from . import y\n")
    assert _imported(module) == {"os", "gateway"}
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("from .a import A\nimport pkg\n")
    graph = _import_graph(tmp_path, ("pkg",))
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a", "pkg"}}
    assert _cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    memos = tmp_path / "memos.py"
    memos.write_text("import functools\nfrom functools import cache, partial\n@functools.lru_cache(maxsize=2)\n"
                     "def f(x):\n    return x\ng = functools.cache(f)\nh = functools.partial(f)\n")
    assert _direct_memos(memos) == [2, 3, 6]
