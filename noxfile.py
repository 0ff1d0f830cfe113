"""Developer tasks: `nox -s tests lint typecheck docs` (CI: see .ci/run); bench, crash,
chaos, mutation and demo on demand."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import nox

#: Every supported Python, oldest first (pyproject's requires-python is the oldest).
PYTHONS = ["3.11", "3.12", "3.13", "3.14"]

# uv builds a session's environment in seconds where pip takes minutes (measured: 8 s
# against 122 s for typecheck's); plain venv + pip where uv is not installed.
nox.options.default_venv_backend = "uv|venv"
nox.options.sessions = ["tests", "lint", "typecheck", "docs"]
nox.options.reuse_existing_virtualenvs = True
# No interpreter is downloaded (the machines reach no such host): one that is missing is
# skipped, or an error where CI is set (nox's default there).
nox.options.download_python = "never"


def _runs(interpreter: str | None) -> bool:
    if interpreter is None:
        return False
    done = subprocess.run([interpreter, "-c", ""], capture_output=True, check=False)  # noqa: S603
    return done.returncode == 0


def _patch_level(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in path.parents[1].name.split("."))


def _put_pyenv_pythons_on_path() -> None:
    """Make ``python3.X`` of every supported version runnable where pyenv has it.

    nox finds an interpreter as ``python3.X`` on PATH, and pyenv's shim for one that is
    not its global version fails: link pyenv's newest patch release of each instead.
    """
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    links = Path(tempfile.gettempdir()) / "dispatch-async-pythons"
    for version in PYTHONS:
        name = f"python{version}"
        if _runs(shutil.which(name)):
            continue
        release = re.compile(rf"{re.escape(version)}\.[0-9]+")
        found = [
            path
            for path in versions.glob(f"{version}.*/bin/{name}")
            if release.fullmatch(path.parents[1].name)
        ]
        if not found:
            continue
        links.mkdir(exist_ok=True)
        staged = links / f".{name}.{os.getpid()}"  # replaced at once: nox runs side by side
        staged.unlink(missing_ok=True)
        staged.symlink_to(max(found, key=_patch_level))
        staged.replace(links / name)
    if links.is_dir():
        os.environ["PATH"] = f"{links}{os.pathsep}{os.environ.get('PATH', '')}"


_put_pyenv_pythons_on_path()


def _put_provisioned_python_on_path() -> None:
    """Put the ``python3.14`` that tools/provision_python314.sh makes on PATH, if it runs.

    pyenv here has none: the script unpacks Debian testing's, in its default folder."""
    folder = Path(tempfile.gettempdir()) / "dispatch-async-python3.14" / "usr" / "bin"
    if not _runs(shutil.which("python3.14")) and _runs(str(folder / "python3.14")):
        os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


_put_provisioned_python_on_path()


def _install_compiled(session: nox.Session, extras: str) -> None:
    """Install the package with *extras*, every module compiled to bytecode beforehand.

    Where PYTHONDONTWRITEBYTECODE is set (this project's machines set it), no process
    writes bytecode, so every process a test or a benchmark starts (a command, a worker,
    the simulator) compiled each module it imported again: about 0.7 s of CPU per start,
    half the time of the command-line tests, and a cost no pip-installed copy pays.
    Compiled here, they are only read; nothing the tests start writes any (a process
    under a file-size limit could leave a truncated one behind).
    """
    session.install("-e", f".[{extras}]", env={"UV_COMPILE_BYTECODE": "1"})
    session.run("python", "-m", "compileall", "-q", "-j", "0", "dispatch_async", "tests")


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The test suite under branch coverage, on each supported Python found; arguments
    after -- go to pytest.

    The whole suite must cover at least [tool.coverage.report] fail_under of the package
    (the commands the tests start included); a selection (-- -k token) only reports it."""
    _install_compiled(session, "test")
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


@nox.session(python=PYTHONS[-1])
def compat(session: nox.Session) -> None:
    """The SDK's own tests on the newest Python (CI's second run, beside the oldest's full one).

    Left out here, run in full on the oldest Python: the tests that mostly start processes
    (the fleet's workers and Redis servers, the command line, the crash explorer, the
    callback receiver killed under load), the documentation, and the phone-number parser's
    comparison with phonenumbers over 100,000 numbers (pure Python on both sides). They time
    the machine more than the interpreter; leaving them out keeps CI within its time.
    """
    _install_compiled(session, "test")
    left_out = [f"--ignore=tests/{name}" for name in COMPAT_LEFT_OUT]
    session.run("pytest", *left_out, *session.posargs)


#: What `compat` leaves to the oldest Python's full run.
COMPAT_LEFT_OUT = (
    "fleet",
    "cli",
    "test_callbacks_sigkill.py",
    "test_crash_points.py",
    "test_docs_examples.py",
    "test_docs_site.py",
    "test_e164.py",
)


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
    _install_compiled(session, "test")
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session
def crash(session: nox.Session) -> None:
    """A send killed, cut off by a power loss and failed at each of its I/O points (<= 20 min).

    Ends with `crash points: N explored, 0 lost, 0 sent twice`; `-- --only 1:17:enospc`
    replays one scenario (see docs/guides/command-line.md).
    """
    _install_compiled(session, "test")
    session.run("python", "-m", "tests.crash_points", *session.posargs)


@nox.session
def chaos(session: nox.Session) -> None:
    """A queued job of 200,000 rows over 20 workers, one SIGKILLed every 1.5 s and Redis
    restarted once (needs redis-server; about a minute). Exits 1 unless every line is
    recorded once and no number was received twice; `-- --workers 50` for 50 workers,
    `-- --cluster` on a Redis Cluster with a primary failed over instead of the restart.
    See docs/guides/fleet-throughput.md.
    """
    _install_compiled(session, "test")
    session.run("python", "benchmarks/chaos.py", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The demo: 100,000 recipients through the embedded simulator."""
    _install_compiled(session, "cli")
    session.run("dispatch-async", "demo", *session.posargs)


@nox.session(python=PYTHONS[-1])
def release(session: nox.Session) -> None:
    """What a stranger installs: the sdist and the wheel built from it, `twine check`ed,
    then the wheel (not the clone) installed with pip into a fresh environment on the
    oldest and the newest supported Python, where the README's quick start and
    `dispatch-async demo` run from a folder outside the clone. The wheel's version,
    `dispatch_async.__version__` and `dispatch-async --version` must agree."""
    session.install("build[uv]>=1.2", "twine>=6.1")
    dist = Path(session.create_tmp()).resolve() / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--installer", "uv", "--outdir", str(dist))
    session.run("twine", "check", "--strict", *sorted(str(path) for path in dist.iterdir()))
    (wheel,) = dist.glob("*.whl")
    code, summary = _readme_quick_start()
    with tempfile.TemporaryDirectory(prefix="dispatch-async-release-") as outside:
        Path(outside, "quickstart.py").write_text(code, encoding="utf-8")
        with session.chdir(outside):  # nothing of the clone is importable from here
            for python in (PYTHONS[0], PYTHONS[-1]):
                _try_the_wheel(session, wheel, Path(outside, f"venv-{python}"), python, summary)


def _try_the_wheel(
    session: nox.Session, wheel: Path, venv: Path, python: str, summary: str
) -> None:
    """Install *wheel* with pip into a new *venv* on *python*, and run what a reader would."""
    interpreter = shutil.which(f"python{python}")
    if interpreter is None or not _runs(interpreter):
        session.error(f"python{python} not found: the release is tried on it")
    session.run(interpreter, "-m", "venv", str(venv), external=True)
    bin_dir = venv / "bin"
    quiet = ["-q", "--disable-pip-version-check"]
    session.run(bin_dir / "python", "-m", "pip", "install", *quiet, f"{wheel}[cli]", external=True)
    version = wheel.name.split("-")[1]
    where = venv / "lib" / f"python{python}" / "site-packages" / "dispatch_async" / "__init__.py"
    show = "import dispatch_async as d; print(d.__version__, d.__file__)"
    _expect(session, [bin_dir / "python", "-c", show], f"{version} {where}")
    _expect(
        session, [bin_dir / "dispatch-async", "--version"], f"dispatch-async, version {version}"
    )
    _expect(session, [bin_dir / "python", "quickstart.py"], summary)
    demo_files = {"TMPDIR": str(venv.parent)}  # not the session's, in the clone
    session.run(bin_dir / "dispatch-async", "demo", "--quiet", env=demo_files, external=True)


def _expect(session: nox.Session, command: list[str | Path], first_line: str) -> None:
    """Run *command*; the first line it prints must be *first_line*."""
    output = session.run(*command, external=True, silent=True) or ""
    if output.splitlines()[:1] != [first_line]:
        session.error(f"{command} printed {output!r}, not {first_line!r} first")


def _readme_quick_start() -> tuple[str, str]:
    """The README's quick start: its python block, and the first line of the output shown."""
    readme = Path("README.md").read_text(encoding="utf-8")
    snippet = readme.split("[start:quickstart] -->", 1)[1].split("[end:quickstart]", 1)[0]
    code, output = re.findall(r"```(?:python|text)\n(.*?)```", snippet, flags=re.DOTALL)
    return code, output.splitlines()[0]
