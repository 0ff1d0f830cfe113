"""Developer tasks: CI runs `nox -s tests lint typecheck docs`; bench, crash, demo on demand."""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "lint", "typecheck", "docs"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite under branch coverage; arguments after -- go to pytest.

    The whole suite must cover at least [tool.coverage.report] fail_under of the package
    (the commands the tests start included); a selection (-- -k token) only reports it."""
    session.install("-e", ".[test]")
    session.run("coverage", "erase")
    session.run("coverage", "run", "-m", "pytest", *session.posargs)
    session.run("coverage", "combine", "--quiet")
    session.run("coverage", "report", *(["--fail-under=0"] if session.posargs else []))


@nox.session
def mutation(session: nox.Session) -> None:
    """Mutation testing of the core modules ([tool.mutmut] in pyproject.toml), niced, two
    workers; prints the score per module. Not in CI (see docs/guides/testing.md for its
    time). Arguments after -- select mutants: `-- "dispatch_async._retry*"`."""
    session.install("-e", ".[test]", "mutmut>=3.8,<3.9")
    os.nice(19)  # inherited by every process it starts: the machine is shared
    session.run("mutmut", "run", "--max-children", "2", *session.posargs)
    session.run("python", "tools/mutation_score.py")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint rules (ASYNC included) and formatting."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package and the typing examples in tests/typing."""
    session.install("-e", ".[test]", "mypy>=1.10")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site, in site/: broken links and missing references fail the build."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(name="docs-serve")
def docs_serve(session: nox.Session) -> None:
    """The documentation, rebuilt as you edit it, on http://127.0.0.1:8000 (Ctrl-C stops)."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "serve", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks against a raw aiohttp baseline (see docs/guides/performance.md)."""
    session.install("-e", ".[test]")
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session
def crash(session: nox.Session) -> None:
    """A send killed, cut off by a power loss and failed at each of its I/O points (<= 20 min).

    Ends with `crash points: N explored, 0 lost, 0 sent twice`; `-- --only 1:17:enospc`
    replays one scenario (see docs/guides/command-line.md).
    """
    session.install("-e", ".[test]")
    session.run("python", "-m", "tests.crash_points", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The demo: 100,000 recipients through the embedded simulator."""
    session.install("-e", ".[cli]")
    session.run("dispatch-async", "demo", *session.posargs)
