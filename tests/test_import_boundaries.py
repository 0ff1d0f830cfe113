"""Which modules may import which: the SDK never imports the command line, and the
command line uses only the SDK's public names. Every module imports on its own, no two
modules import each other (directly or round a longer circle), and none is over 450 lines."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import dispatch_async

PACKAGE = Path(dispatch_async.__file__).resolve().parent
ROOT = PACKAGE.parent
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for path in PACKAGE.rglob("*.py")
)


def module_name(path: Path, root: Path = ROOT) -> str:
    """The name *path* is imported by when *root* is on ``sys.path``."""
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def imported_by(path: Path, root: Path = ROOT) -> set[str]:
    """Absolute names of every module *path* imports (relative imports resolved), at
    module level, in a function or under ``if TYPE_CHECKING:`` alike.

    *root* is the directory on ``sys.path``: the repository for the package, the
    script's own directory for benchmarks/ and tools/ (they import each other by bare name).
    """
    module = module_name(path, root)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


# Importing any dispatch_async.X runs the package's __init__ first: a process that has
# imported the package, forked, is where a fresh interpreter would be when it imports X.
# One fork per module instead of one interpreter each: milliseconds, not a second.
_IMPORT_EACH = """
import importlib, json, os, sys, traceback
import dispatch_async
errors = {}
for module in sys.argv[1:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        told = pipe.read().decode()
    status = os.waitpid(pid, 0)[1]
    errors[module] = told or ("" if status == 0 else f"exit status {status}")
print(json.dumps(errors))
"""


@pytest.fixture(scope="module")
def import_errors() -> dict[str, str]:
    """What importing each module first, in a process of its own, raised ("" for nothing)."""
    done = subprocess.run(  # noqa: S603 - our own interpreter, a fixed script
        [sys.executable, "-c", _IMPORT_EACH, *MODULES],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    errors: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    assert sorted(errors) == MODULES
    return errors


@pytest.mark.parametrize("module", MODULES)
def test_every_module_imports_on_its_own(module: str, import_errors: dict[str, str]) -> None:
    assert import_errors[module] == ""


def test_a_module_that_fails_to_import_is_told(tmp_path: Path) -> None:
    """The check itself: a module raising at import is reported with its traceback."""
    (tmp_path / "broken_on_import.py").write_text("raise RuntimeError('broken on import')\n")
    done = subprocess.run(  # noqa: S603 - our own interpreter, a fixed script
        [sys.executable, "-c", _IMPORT_EACH, "broken_on_import", "dispatch_async._retry"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])},
        check=False,
    )
    errors = json.loads(done.stdout.splitlines()[-1])
    assert "RuntimeError: broken on import" in errors["broken_on_import"]
    assert errors["dispatch_async._retry"] == ""


def test_nothing_outside_the_command_line_imports_it() -> None:
    for path in PACKAGE.rglob("*.py"):
        if "_cli" in path.relative_to(PACKAGE).parts:
            continue
        crossing = {name for name in imported_by(path) if name.startswith("dispatch_async._cli")}
        assert not crossing, f"{path.relative_to(ROOT)} imports {crossing}"


def test_the_command_line_uses_only_public_names_of_the_sdk() -> None:
    public = {
        "dispatch_async",
        "dispatch_async.testing",
        "dispatch_async.instrumentation",
        "dispatch_async.callbacks",
    }
    for path in (PACKAGE / "_cli").rglob("*.py"):
        for name in imported_by(path):
            if not name.startswith("dispatch_async") or name.startswith("dispatch_async._cli"):
                continue
            module, _, member = name.rpartition(".")
            if name in public:
                continue
            assert module in public, f"{path.name} imports {name}"
            exported = importlib.import_module(module).__all__
            assert member in exported, f"{path.name} imports the private {name}"


# Archived or in maintenance only (issue 27): backoff 2.2 uses an asyncio function removed
# in Python 3.16.
RETIRED = frozenset({"backoff"})


def test_nothing_imports_a_retired_library() -> None:
    for path in PACKAGE.rglob("*.py"):
        used = {name.split(".")[0] for name in imported_by(path)}
        assert not used & RETIRED, f"{path.relative_to(ROOT)} imports {used & RETIRED}"


def test_no_extra_requires_a_retired_library() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for extra, requirements in {
        "": project["dependencies"],
        **project["optional-dependencies"],
    }.items():
        names = {
            re.split(r"[^A-Za-z0-9_.-]", requirement)[0].lower() for requirement in requirements
        }
        assert not names & RETIRED, f"[{extra}] requires {names & RETIRED}"


def test_without_click_the_command_says_what_to_install(tmp_path: Path) -> None:
    # A site directory where "click" cannot be imported, put first on the path.
    (tmp_path / "click.py").write_text("raise ImportError('no click here', name='click')\n")
    done = subprocess.run(
        [sys.executable, "-m", "dispatch_async._cli", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])},
        check=False,
    )
    assert done.returncode == 2
    assert 'pip install "dispatch-async[cli]"' in done.stderr
    assert "Traceback" not in done.stderr


# What the code imports, as a graph, and the circles in it.

#: Each tree whose modules import each other, with the directory on ``sys.path`` for it.
TREES = {"dispatch_async": ROOT, "benchmarks": ROOT / "benchmarks", "tools": ROOT / "tools"}


def import_graph(files: list[Path], root: Path) -> dict[str, set[str]]:
    """Module to the modules among *files* it imports.

    ``from package import module`` is an edge to the module alone when the package is
    one the importer lives in: that package is always imported first, so it is not
    waited on. Any other name taken from a package is an edge to the package.
    """
    modules = {module_name(path, root): path for path in files}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        names = imported_by(path, root) & modules.keys()
        enclosing = {module.rsplit(".", depth)[0] for depth in range(1, module.count(".") + 1)}
        graph[module] = {
            name
            for name in names
            if name != module
            and not (name in enclosing and any(other.startswith(f"{name}.") for other in names))
        }
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of imports, one per group of modules that reach each other, as the
    path round it (``[a, b, c, a]``); none for a graph without one."""
    found: list[list[str]] = []
    for group in _strongly_connected(graph):
        if len(group) < 2:
            continue
        # A path from the group's first module back to it, through the group only.
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        while queue:
            module = queue.pop(0)
            for name in sorted(graph[module] & group):
                if name == start:
                    found.append([*paths[module], start])
                    queue.clear()
                    break
                if name not in paths:
                    paths[name] = [*paths[module], name]
                    queue.append(name)
    return found


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's groups of modules that each reach all the others (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, names = work[-1]
            name = next(names, None)
            if name is not None:
                if name not in index:
                    index[name] = low[name] = len(index)
                    stack.append(name)
                    on_stack.add(name)
                    work.append((name, iter(sorted(graph[name]))))
                elif name in on_stack:
                    low[module] = min(low[module], index[name])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == module:
                        break
                groups.append(group)
    return groups


@pytest.mark.parametrize("tree", sorted(TREES))
def test_no_two_modules_import_each_other(tree: str) -> None:
    """No circle of imports, directly or round several modules, counting imports at
    module level, inside functions and under ``if TYPE_CHECKING:`` alike: a circle is
    one idea split badly, wherever its imports sit."""
    root = TREES[tree]
    graph = import_graph(sorted((ROOT / tree).rglob("*.py")), root)
    found = circles(graph)
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


class TestTheCircleCheck:
    def test_a_circle_is_told_as_the_path_round_it(self, tmp_path: Path) -> None:
        (tmp_path / "first.py").write_text("import second\n")
        (tmp_path / "second.py").write_text("def late():\n    from third import x\n")
        (tmp_path / "third.py").write_text(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import first\n"
        )
        (tmp_path / "alone.py").write_text("import first\n")
        graph = import_graph(sorted(tmp_path.glob("*.py")), tmp_path)
        assert circles(graph) == [["first", "second", "third", "first"]]

    def test_a_package_importing_its_own_module_is_no_circle(self, tmp_path: Path) -> None:
        package = tmp_path / "package"
        package.mkdir()
        (package / "__init__.py").write_text("from .part import thing\n")
        (package / "part.py").write_text("from . import other\nthing = 1\n")
        (package / "other.py").write_text("")
        graph = import_graph(sorted(tmp_path.rglob("*.py")), tmp_path)
        assert circles(graph) == []

    def test_a_module_taking_a_name_from_its_package_that_imports_it_is_a_circle(
        self, tmp_path: Path
    ) -> None:
        package = tmp_path / "package"
        package.mkdir()
        (package / "__init__.py").write_text("from .part import thing\nother = 2\n")
        (package / "part.py").write_text("from package import other\nthing = 1\n")
        graph = import_graph(sorted(tmp_path.rglob("*.py")), tmp_path)
        assert circles(graph) == [["package", "package.part", "package"]]


# Over this many lines a module holds more than one job (the brief's guideline).
MAX_LINES = 450
# removed by the wings move (issue 36): send.py is cut there.
SIZED = sorted(
    str(path.relative_to(ROOT))
    for tree in ("dispatch_async", "benchmarks")
    for path in (ROOT / tree).rglob("*.py")
)


@pytest.mark.parametrize("path", SIZED)
def test_no_module_is_over_450_lines(path: str) -> None:
    lines = len((ROOT / path).read_text().splitlines())
    assert lines <= MAX_LINES, f"{path} has {lines} lines"


# The command line's wings (docs/guides/contributing.md), top to bottom: the commands at
# _cli's top, then queued, job, reading. Each may import the wings below it and `screen`;
# `screen` imports none of them.
CLI = PACKAGE / "_cli"
FLOORS = ("top", "queued", "job", "reading")


def _wing(module: str) -> str:
    """The wing of a module of the command line: its first subpackage, or "top"."""
    parts = module.split(".")
    wing = parts[2] if len(parts) > 2 else "top"
    return wing if wing in (*FLOORS, "screen") else "top"


def _may_import(wing: str) -> set[str]:
    if wing == "screen":
        return {"screen"}
    return {"screen", *FLOORS[FLOORS.index(wing) :]}


def _cli_imports() -> dict[str, set[str]]:
    """Every module of the command line and the modules of the command line it imports."""
    return import_graph(sorted(CLI.rglob("*.py")), ROOT)


class TestTheCommandLineWings:
    def test_every_wing_is_a_subpackage_that_says_what_it_may_import(self) -> None:
        for wing in ("reading", "job", "queued", "screen"):
            doc = ast.get_docstring(ast.parse((CLI / wing / "__init__.py").read_text()))
            assert doc, f"_cli/{wing} has no docstring"
            assert "import" in doc.lower(), f"_cli/{wing}'s docstring does not say what it imports"

    def test_no_wing_imports_a_wing_above_it(self) -> None:
        for module, imported in _cli_imports().items():
            wing = _wing(module)
            if wing == "top":
                continue
            above = {name for name in imported if _wing(name) not in _may_import(wing)}
            assert not above, f"{module} ({wing}) imports {above}"

    def test_screen_imports_no_other_wing(self) -> None:
        for module, imported in _cli_imports().items():
            if _wing(module) == "screen":
                others = {name for name in imported if _wing(name) != "screen"}
                assert not others, f"{module} imports {others}"

    def test_the_directions_are_the_drawn_ones(self) -> None:
        """The rule itself: down the floors and to the screen, never up or sideways from it."""
        assert _may_import("queued") == {"screen", "queued", "job", "reading"}
        assert _may_import("job") == {"screen", "job", "reading"}
        assert _may_import("reading") == {"screen", "reading"}
        assert _may_import("screen") == {"screen"}
        assert _wing("dispatch_async._cli.commands") == "top"
        assert _wing("dispatch_async._cli.job.spec") == "job"
