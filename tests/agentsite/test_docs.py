"""The map and the README name only what exists: every path, module, `file.py::name` and
`runs.<name>` they cite in code spans is checked against the tree, so a move that forgets the
docs fails here (docs/architecture.md says the same of itself)."""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "architecture.md", ROOT / "README.md")
PACKAGES = (
    "agentsite",
    "api",
    "approvals",
    "bench",
    "common",
    "conversations",
    "demo",
    "engine",
    "notifications",
    "tests",
    "tracing",
    "webhooks",
)
# The top folders a path of the tree starts with.
TREE = (*PACKAGES, "docs", "templates", "static", "deploy", "scripts")
# What a code span holds when it names something of the tree.
PATH = re.compile(r"^(?:[\w.-]+/)+[\w.-]*$|^[\w-]+\.(?:py|md|html|js|css|toml|txt)$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
FILE_NAME = re.compile(r"^((?:[\w.-]+/)*[\w.-]+\.py)::([A-Za-z_]\w*)")


def code_spans(path: Path) -> Iterator[tuple[int, str]]:
    """Each inline code span of a Markdown file, with its line; fenced blocks left out."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for span in re.findall(r"`([^`\n]+)`", line):
            yield number, span.strip()


def linked_files(path: Path) -> Iterator[tuple[int, str]]:
    """Each relative link of a Markdown file (not a web address, not an anchor alone)."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if not re.match(r"^(?:[a-z]+:|#)", target):
                yield number, target.split("#", 1)[0]


def resolves(dotted: str) -> bool:
    """Whether `dotted` (a.b.c) is a module of ours or a name defined in one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found: object = importlib.import_module(module_name)
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return _defined_in_source(module_name, parts[cut:])
            found = getattr(found, attribute)
        return True
    return False


def is_model(label: str) -> bool:
    """`app.Model`, as Django names a model."""
    from django.apps import apps

    try:
        apps.get_model(label)
    except (LookupError, ValueError):
        return False
    return True


@functools.cache
def _code() -> str:
    product = [package for package in PACKAGES if package not in ("tests", "bench")]
    return "\n".join(
        path.read_text() for package in product for path in (ROOT / package).rglob("*.py")
    )


def said_in_code(name: str) -> bool:
    """A name the code spells as a string: a permission, a system check's id, an attribute
    a span carries."""
    return f'"{name}"' in _code() or f"'{name}'" in _code()


def _defined_in_source(module_name: str, names: list[str]) -> bool:
    """A class's attribute that only an instance has, or a method: read from the source."""
    module = importlib.import_module(module_name)
    source = Path(module.__file__ or "")
    tree = ast.parse(source.read_text())
    return all(name in _names(tree) for name in names)


def _names(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            found |= {t.attr for t in node.targets if isinstance(t, ast.Attribute)}
        elif isinstance(node, ast.AnnAssign):
            target = node.target
            if isinstance(target, ast.Name):
                found.add(target.id)
            elif isinstance(target, ast.Attribute):
                found.add(target.attr)
    return found


def problems(path: Path) -> list[str]:
    found = []
    where = path.relative_to(ROOT)
    for number, span in code_spans(path):
        span = span.split(" ", 1)[0].rstrip(",.:;")
        by_name = FILE_NAME.match(span)
        if by_name:
            file, name = by_name.groups()
            source = ROOT / file
            if not source.exists() or name not in _names(ast.parse(source.read_text())):
                found.append(f"{where}:{number}: {span}")
            continue
        if span.startswith("runs."):
            if not resolves(f"engine.{span.split('(')[0]}"):
                found.append(f"{where}:{number}: {span}")
            continue
        candidate = span.split("#", 1)[0]
        if PATH.match(candidate) and candidate.split("/", 1)[0] in TREE:
            if not (ROOT / candidate).exists():
                found.append(f"{where}:{number}: {span}")
            continue
        ours = DOTTED.match(span) and span.split(".", 1)[0] in PACKAGES
        if ours and not (resolves(span) or is_model(span) or said_in_code(span)):
            found.append(f"{where}:{number}: {span}")
    for number, target in linked_files(path):
        if target and not (path.parent / target).exists():
            found.append(f"{where}:{number}: link {target}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_the_docs_name_only_what_exists(doc: Path) -> None:
    assert problems(doc) == []


def test_it_finds_a_path_a_module_a_name_and_a_runs_name_that_do_not_exist(
    tmp_path: Path,
) -> None:
    page = ROOT / "docs" / "_checked_by_test_docs.md"
    page.write_text(
        "`engine/runs/decisions.py` `engine/runs/nothing.py` `engine.runs.decide` "
        "`engine.runs.nothing` `runs.decide` `runs._final_write` "
        "`engine/runs/decisions.py::record_decision` `engine/runs/decisions.py::nothing` "
        "[ok](architecture.md) [gone](gone.md) `/chats/<session_id>/`\n"
        "```\nengine/not/checked.py\n```\n"
    )
    try:
        assert [line.split(": ", 1)[1] for line in problems(page)] == [
            "engine/runs/nothing.py",
            "engine.runs.nothing",
            "runs._final_write",
            "engine/runs/decisions.py::nothing",
            "link gone.md",
        ]
    finally:
        page.unlink()
