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
  `marks_cache`...).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WIRE_CLASSES = {"AnthropicMessages", "OpenAIChat", "OpenAIResponses"}


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts)


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


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The readers above find a lazy import and a relative one as they should."""
    module = tmp_path / "m.py"
    module.write_text("import os.path\ndef f():\n    from gateway.wire import x\n    from . import y\n")
    assert _imported(module) == {"os", "gateway"}
