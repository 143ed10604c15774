"""The shape of the code, as docs/architecture.md draws it: imports form a DAG (lazy imports
inside functions included), and no product module imports the demo."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Container, Iterator
from pathlib import Path

import pytest
from agents import Agent

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "agentsite",
    "common",
    "engine",
    "conversations",
    "approvals",
    "tracing",
    "demo",
    "api",
    "webhooks",
    "notifications",
)

# The one agent of a deployment without the demo (tests/settings_without_demo.py).
PLAIN_AGENT = Agent(name="Plain", instructions="Answer briefly.")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path, modules: Container[str] = ()) -> Iterator[str]:
    """Every name an import statement anywhere in the file (functions too) may load.

    `from package import submodule` loads the submodule (the package's `__init__` merely
    runs first, as it does for any import below it); `from package import name` loads the
    package, whose `__init__` defines the name."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names = [f"{target}.{alias.name}" for alias in node.names]
            if not all(name in modules for name in names):
                yield target
            yield from names


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {resolve(name) for name in imported_names(module, path, modules)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(project_modules())


def test_it_finds_the_project_modules(graph: dict[str, set[str]]) -> None:
    assert {"engine.runs", "engine.executor", "conversations.session", "demo.model"} <= set(graph)
    assert graph["engine.tasks"] >= {"engine.runs"}


def test_it_has_no_import_cycle(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_a_submodule_importing_its_sibling_through_the_package_is_no_cycle(
    tmp_path: Path,
) -> None:
    """A package's `__init__` re-exports its stages; a stage importing a sibling stage
    (`from engine.runs import rows`) depends on that sibling, not on the `__init__` above it.
    A stage importing a name the `__init__` re-exports does depend on the `__init__`."""
    runs = tmp_path / "engine" / "runs"
    runs.mkdir(parents=True)
    (tmp_path / "engine" / "__init__.py").write_text("")
    (runs / "__init__.py").write_text("from engine.runs.top import go\n")
    (runs / "rows.py").write_text("X = 1\n")
    (runs / "top.py").write_text("from engine.runs import rows\n")
    graph = import_graph(project_modules(tmp_path))
    assert graph["engine.runs.top"] == {"engine.runs.rows"}
    assert cycles(graph) == []
    (runs / "rows.py").write_text("from engine.runs import go\n")
    assert cycles(import_graph(project_modules(tmp_path))) == [
        ["engine.runs", "engine.runs.rows", "engine.runs.top"]
    ]


def test_it_sees_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "engine" / "a.py").write_text("from engine import b\n")
    (tmp_path / "engine" / "b.py").write_text("def f():\n    from .a import x\n")
    (tmp_path / "engine" / "c.py").write_text("import engine.b\n")
    graph = import_graph(project_modules(tmp_path))
    assert cycles(graph) == [["engine.a", "engine.b"]]


# The floors of docs/architecture.md. An import goes down a floor or stays on its own.
PLUMBING = ("agentsite.db", "common")
STORAGE = (
    "conversations.items",
    "conversations.session",
    "tracing.calls",
    "tracing.exporter",
    "tracing.forwarding",
    "tracing.messages",
    "tracing.otlp",
    "tracing.recording",
    "tracing.redaction",
    "tracing.rows",
)


def floor(module: str) -> int:
    if module in PACKAGES or any(module == p or module.startswith(f"{p}.") for p in PLUMBING):
        return 0  # plumbing (and the packages' empty __init__ modules)
    storage = any(module == s or module.startswith(f"{s}.") for s in STORAGE)
    if module.endswith((".models", ".sql")) or storage:
        return 1  # storage: rows, their rules, the SDK adapters
    if module.endswith(".admin"):
        return 3  # the admin is a face, whichever app's rows it shows
    if module.startswith("engine."):
        return 2  # the run engine
    if module.startswith("agentsite."):
        return 4  # the project package: settings, urls, asgi, routing
    return 3  # faces: views, consumers, forms, admin, commands, and the demo app


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets if floor(b) > floor(a))


def test_imports_only_go_down_the_floors(graph: dict[str, set[str]]) -> None:
    assert upward(graph) == []


def test_it_sees_an_import_up_the_floors() -> None:
    graph = {"tracing.exporter": {"engine.events", "common.formatting"}, "engine.events": set()}
    assert upward(graph) == [("tracing.exporter", "engine.events")]


def test_the_executor_knows_nothing_of_the_engine(graph: dict[str, set[str]]) -> None:
    assert graph["engine.executor"] <= {"engine", "engine.serverloop"}


def test_common_imports_nothing_of_ours(graph: dict[str, set[str]]) -> None:
    # Nothing outside `common/`: one helper of it may use another (the outbound opener, where
    # it may connect).
    leaves = {
        m: {t for t in targets if not (t == "common" or t.startswith("common."))}
        for m, targets in graph.items()
        if m.startswith("common")
    }
    assert leaves and all(targets == set() for targets in leaves.values()), leaves


def test_no_product_module_imports_the_demo(graph: dict[str, set[str]]) -> None:
    importers = {
        module
        for module, targets in graph.items()
        if not module.startswith("demo") and any(t.startswith("demo") for t in targets)
    }
    assert importers == set()


WITHOUT_DEMO = """
import importlib, sys
import django
django.setup()
from django.core.management import call_command
from tests.agentsite.test_architecture import project_modules
for name in project_modules():
    if not name.startswith("demo"):
        importlib.import_module(name)
call_command("migrate", verbosity=0)
call_command("check", fail_level="WARNING")
from engine import registry
assert registry.agent_names() == ["plain"], registry.agent_names()
loaded = sorted(name for name in sys.modules if name == "demo" or name.startswith("demo."))
assert loaded == [], loaded
print("no demo")
"""


def test_the_site_runs_without_the_demo_app(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings_without_demo",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'no-demo.sqlite3'}",
    }
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_DEMO],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("no demo")


def test_the_readme_layout_names_every_package() -> None:
    """The README's layout block lists each package of the project (and of its tests)."""
    section = (ROOT / "README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    named = {word.rstrip("/") for line in block.splitlines() for word in line.split()[:2]}
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert set(PACKAGES) <= packages
    assert packages - named == set()


def is_view(module: str) -> bool:
    return module.rsplit(".", 1)[-1].endswith("views")


def test_the_engine_imports_no_view(graph: dict[str, set[str]]) -> None:
    engine = {m: {t for t in ts if is_view(t)} for m, ts in graph.items() if m.startswith("engine")}
    assert {m: ts for m, ts in engine.items() if ts} == {}


def test_the_api_imports_no_view_module_of_another_app(graph: dict[str, set[str]]) -> None:
    api = {
        (module, target)
        for module, targets in graph.items()
        if module.startswith("api.")
        for target in targets
        if is_view(target) and not target.startswith("api.")
    }
    assert api == set()
    assert "conversations.actions" in graph["api.endpoints"]


def test_it_sees_a_view_imported_from_the_engine() -> None:
    graph = {"engine.runs.decisions": {"approvals.views", "engine.models"}, "api.endpoints": set()}
    assert {m for m, ts in graph.items() if any(is_view(t) for t in ts)} == {
        "engine.runs.decisions"
    }
