"""The examples in the README and docs/: found, then run the way a reader would run them.

Rules (the same ones the docs state for their authors):

- a ```python block runs on its own as a script, in a fresh process with a temp dir as cwd;
- a ```console block: each line starting with ``$ `` (plus its ``\\`` continuation lines)
  runs in bash, in order, with a simulator running and DISPATCH_BASE_URL,
  DISPATCH_CLIENT_SECRET and DISPATCH_ACCOUNT exported; every command must exit 0; a
  document's console blocks run one after the other in one temp dir, as a reader
  following it top to bottom would (a block finds the files of the blocks above it);
- ``<!-- not-run: reason -->`` on the line before a fence skips it; any other block
  (bash, text, toml, json, ...) is never run;
- every python block, not-run ones included, passes ``mypy --strict``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs")
RUN_LANGUAGES = frozenset({"python", "console"})
SIMULATOR_SECRET = "test-secret"
SIMULATOR_ACCOUNT = "docs"
TIMEOUT = 120.0

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_NOT_RUN = re.compile(r"^\s*<!--\s*not-run:\s*(?P<reason>.*?)\s*-->\s*$")


class ExampleFailed(AssertionError):
    """An example did not run as written: its output names the file and line."""


@dataclass(frozen=True)
class Example:
    """One fenced block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    source: str
    not_run: str | None  # the reason given in a not-run marker, if any

    @property
    def name(self) -> str:
        """``file:line``, relative to the project: the test id and the error's first words."""
        with contextlib.suppress(ValueError):
            return f"{self.path.relative_to(PROJECT_ROOT)}:{self.line}"
        return f"{self.path.name}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES and self.not_run is None

    def commands(self) -> list[str]:
        """The shell commands of a console block: ``$ `` lines with their continuations."""
        commands: list[str] = []
        continued = False
        for line in self.source.splitlines():
            if continued:
                commands[-1] += "\n" + line
            elif line.startswith("$ "):
                commands.append(line[2:])
            else:
                continue
            continued = line.endswith("\\")
        return commands


def markdown_files(root: Path = PROJECT_ROOT) -> list[Path]:
    """README.md and every Markdown file under docs/, in a stable order."""
    found: list[Path] = []
    for name in DOCUMENTS:
        path = root / name
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(path.rglob("*.md")))
    return found


def parse(path: Path) -> list[Example]:
    """Every fenced block of *path*; an unclosed fence or an empty not-run reason is an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    examples: list[Example] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        start = index
        body: list[str] = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index][indent:] if lines[index][:indent].isspace() else lines[index])
            index += 1
        if index == len(lines):
            raise ValueError(f"{path}:{start + 1}: a code fence that is never closed")
        index += 1
        previous = next((text for text in reversed(lines[:start]) if text.strip()), "")
        marker = _NOT_RUN.match(previous)
        if marker is not None and not marker["reason"]:
            raise ValueError(f"{path}:{start}: a not-run marker must say why")
        examples.append(
            Example(
                path=path,
                line=start + 1,
                language=opening["lang"].lower(),
                source="\n".join(body) + "\n",
                not_run=None if marker is None else marker["reason"],
            )
        )
    return examples


def collect(root: Path = PROJECT_ROOT) -> list[Example]:
    """Every block of the project's documents that the test suite runs."""
    return [example for path in markdown_files(root) for example in parse(path) if example.runs]


def in_documents(examples: list[Example]) -> dict[str, list[Example]]:
    """*examples* by document (its path from the project), each document's in order."""
    found: dict[str, list[Example]] = {}
    for example in examples:
        found.setdefault(example.name.rpartition(":")[0], []).append(example)
    return found


def typed(root: Path = PROJECT_ROOT) -> list[Example]:
    """Every python block, run or not: a reader copies a not-run one too, so mypy checks it."""
    return [e for path in markdown_files(root) for e in parse(path) if e.language == "python"]


def _environment(extra: dict[str, str]) -> dict[str, str]:
    """The reader's environment: this interpreter's scripts first, no DISPATCH_* leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _check(example: Example, done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode != 0:
        raise ExampleFailed(
            f"{example.name}: {what} exited {done.returncode}\n"
            f"--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"
        )


def run_python(example: Example, workdir: Path) -> subprocess.CompletedProcess[str]:
    """Run a python block as ``python -W error example.py`` in *workdir*."""
    script = workdir / "example.py"
    script.write_text(example.source, encoding="utf-8")
    done = subprocess.run(  # noqa: S603 - this interpreter, a file we wrote
        [sys.executable, "-W", "error", script.name],
        cwd=workdir,
        env=_environment({}),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    _check(example, done, "the script")
    return done


def run_console(example: Example, workdir: Path, base_url: str) -> subprocess.CompletedProcess[str]:
    """Run a console block's commands in bash, stopping at the first that fails."""
    commands = example.commands()
    if not commands:
        raise ExampleFailed(f"{example.name}: a console block without a `$ ` command")
    lines = ["set -e -o pipefail"]
    for command in commands:
        # Echo each command first, so a failure's output says which one it was.
        lines.append(f"printf '%s\\n' {shlex.quote('$ ' + command)} >&2")
        lines.append(command)
    env = _environment(
        {
            "DISPATCH_BASE_URL": base_url,
            "DISPATCH_CLIENT_SECRET": SIMULATOR_SECRET,
            "DISPATCH_ACCOUNT": SIMULATOR_ACCOUNT,
        }
    )
    # Files, not pipes: a server the block starts with `&` keeps its output open, and the
    # block is over when bash exits. Its own process group: whatever it left running is
    # stopped afterwards, also when a command failed before the block's own clean-up.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(  # noqa: S603 - bash running the documented commands
            ["bash", "-c", "\n".join(lines)],  # noqa: S607 - bash from PATH, as a reader has it
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            returncode = process.wait(timeout=TIMEOUT)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            process.wait()
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(
            process.args,
            returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )
    _check(example, done, "a command")
    return done


@contextlib.contextmanager
def simulator() -> Iterator[str]:
    """``python -m dispatch_async.testing`` on a free port, as its own process: its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "dispatch_async.testing", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_environment({}),
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()  # it prints its URL once it listens
        if not url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"the simulator did not start: {url!r}")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def mypy_strict(examples: list[Example], workdir: Path) -> dict[str, list[str]]:
    """Run mypy --strict once over the python *examples*: their errors, by example name."""
    files: dict[str, Example] = {}
    paths: list[str] = []
    for number, example in enumerate(examples):
        path = workdir / f"example_{number}.py"
        path.write_text(example.source, encoding="utf-8")
        files[path.name] = example
        paths.append(str(path))
    done = subprocess.run(  # noqa: S603 - mypy from this interpreter
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", *paths],
        cwd=PROJECT_ROOT,  # the project's mypy settings (python_version, overrides)
        env=_environment({"MYPYPATH": ""}),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    errors: dict[str, list[str]] = {example.name: [] for example in examples}
    for line in done.stdout.splitlines():
        file_name, _, rest = line.partition(":")
        example = files.get(Path(file_name).name)
        if example is None:
            continue
        number, _, message = rest.partition(":")
        if number.isdigit():
            # Point at the Markdown line: the fence, then the line inside the block.
            line = f"{example.path.name}:{example.line + int(number)}:{message}"
        errors[example.name].append(line)
    if done.returncode not in (0, 1) or (done.returncode == 1 and not any(errors.values())):
        raise RuntimeError(f"mypy did not run: {done.stdout}\n{done.stderr}")
    return errors
