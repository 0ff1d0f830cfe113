"""Which modules may import which: the SDK never imports the command line, and the
command line uses only the SDK's public names. Every module imports on its own."""

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


def imported_by(path: Path) -> set[str]:
    """Absolute names of every module *path* imports (relative imports resolved)."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
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


# The command line's wings (docs/guides/contributing.md), top to bottom: the commands at
# _cli's top, then queued, job, reading. Each may import the wings below it and `screen`;
# `screen` imports none of them.
CLI = PACKAGE / "_cli"
FLOORS = ("top", "queued", "job", "reading")


def _cli_module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


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
    modules = {_cli_module(path): path for path in CLI.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        names = imported_by(path)
        graph[module] = {
            name if name in modules else name.rpartition(".")[0]
            for name in names
            if name in modules or name.rpartition(".")[0] in modules
        } - {module}
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of *graph*, as the modules around it, or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(graph.get(module, ())):
            found = visit(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return None


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

    def test_the_command_line_has_no_import_circle(self) -> None:
        assert _circle(_cli_imports()) is None

    def test_a_circle_is_found(self) -> None:
        """The check itself: a circle of three is told, a ladder is not."""
        assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
        assert _circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None

    def test_the_directions_are_the_drawn_ones(self) -> None:
        """The rule itself: down the floors and to the screen, never up or sideways from it."""
        assert _may_import("queued") == {"screen", "queued", "job", "reading"}
        assert _may_import("job") == {"screen", "job", "reading"}
        assert _may_import("reading") == {"screen", "reading"}
        assert _may_import("screen") == {"screen"}
        assert _wing("dispatch_async._cli.commands") == "top"
        assert _wing("dispatch_async._cli.job.spec") == "job"
