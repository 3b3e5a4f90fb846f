"""The repository stands alone: a bare clone passes `make test`, and the README links stay inside it."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO / "tests" / "data" / "traces"
OUTSIDE = re.compile(r"\.\./shared|parent\s*/\s*[\"']shared[\"']|/work/shared")


def test_nothing_reads_or_links_outside_the_repository() -> None:
    files = [REPO / "README.md", REPO / "Makefile", *REPO.glob(".ci/*"), *REPO.glob("docs/*.md")]
    for folder in ("tests", "bench", "scripts", "gateway", "policies", "storage"):
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".md", ".yaml", ".html", ".sh")
                  and "node_modules" not in p.parts]  # the npm-installed client CLIs are not the repository's
    offenders = [str(p.relative_to(REPO)) for p in files if p.is_file() and p != Path(__file__).resolve()
                 and OUTSIDE.search(p.read_text(encoding="utf-8", errors="replace"))]
    assert offenders == []


def test_readme_links_resolve_inside_the_repository() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    links = [target for target in re.findall(r"\]\(([^)#]+)\)", readme) if "://" not in target]
    assert links, "the README links to its design page"
    for target in links:
        resolved = (REPO / target).resolve()
        assert resolved.is_relative_to(REPO) and resolved.exists(), target


def test_every_trace_is_in_the_repository_with_its_source_and_licence() -> None:
    traces = sorted(TRACES.glob("*.jsonl"))
    assert len(traces) >= 10
    index = (TRACES / "README.md").read_text(encoding="utf-8")
    for trace in traces:
        assert f"`{trace.name}`" in index
        row = next(line for line in index.splitlines() if f"`{trace.name}`" in line)
        assert "@" in row and "MIT" in row  # source at a commit, and the licence
