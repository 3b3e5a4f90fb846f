"""Every package the installed modules import is a declared runtime dependency (not only a dev extra's).

`pip install .` installs `[project].dependencies` and what they need, nothing of the `dev` extra: a
module that imports a package only the extra brings starts in `make test` and crashes in `make run`
(orjson did, until it was declared). Each third-party import of gateway/, storage/ and policies/ must
come from a distribution named in `dependencies` itself, so that it does not hang on another package's
requirements either.
"""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OWN = ("gateway", "storage", "policies")


def _imported_top_names() -> dict[str, str]:
    """Top-level module name -> a file importing it, over the installed packages' sources."""
    found: dict[str, str] = {}
    for package in OWN:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(REPO)))
    return {name: where for name, where in found.items()
            if name not in sys.stdlib_module_names and name not in OWN}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(extra: str | None = None) -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return {_normal(re.split(r"[\s\[<>=!~;]", spec, maxsplit=1)[0]) for spec in specs}


def test_every_runtime_import_is_a_declared_dependency() -> None:
    runtime = _declared()
    providers = importlib.metadata.packages_distributions()
    undeclared = {}
    for name, where in _imported_top_names().items():
        distributions = {_normal(d) for d in providers.get(name, [])}
        assert distributions, f"{where} imports {name}, which no installed distribution provides"
        if not distributions & runtime:
            undeclared[name] = (where, sorted(distributions))
    assert not undeclared, f"imported but not in [project].dependencies: {undeclared}"


def test_the_check_sees_a_dev_only_package() -> None:
    """The rule bites: pytest, a dev extra's package, is not a runtime dependency."""
    assert "pytest" in _declared("dev") and "pytest" not in _declared()
