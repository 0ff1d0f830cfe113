"""Every example in the README and docs/ runs as written, and the API reference is complete.

One test per block, named ``file:line``: breaking an example breaks a named test. The rules
are in tests/markdown_examples.py.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

import dispatch_async
import dispatch_async.callbacks
import dispatch_async.instrumentation
import dispatch_async.testing

from .markdown_examples import (
    PROJECT_ROOT,
    Example,
    ExampleFailed,
    collect,
    in_documents,
    mypy_strict,
    parse,
    run_console,
    run_python,
    simulator,
    typed,
)

EXAMPLES = collect()
PYTHON = [example for example in EXAMPLES if example.language == "python"]
CONSOLE = [example for example in EXAMPLES if example.language == "console"]
TYPED = typed()
CONSOLE_BY_DOCUMENT = in_documents(CONSOLE)


def name(example: Example) -> str:
    return example.name


# The project's examples


@pytest.mark.parametrize("example", PYTHON, ids=name)
def test_python_example_runs_as_a_script(example: Example, tmp_path: Path) -> None:
    run_python(example, tmp_path)


@pytest.mark.parametrize("document", sorted(CONSOLE_BY_DOCUMENT), ids=str)
def test_a_documents_console_blocks_run_in_order_in_one_folder(
    document: str, tmp_path: Path
) -> None:
    # As a reader follows a guide top to bottom: one folder, one simulator, block after
    # block; a block finds the files the ones above it left (and must not trip on them).
    examples = CONSOLE_BY_DOCUMENT[document]
    if any("redis-server" in e.source for e in examples) and shutil.which("redis-server") is None:
        # As tests/fleet does: CI must have it, elsewhere it is an optional install.
        if os.environ.get("CI"):
            pytest.fail("CI must provide redis-server (see .ci/run)")
        pytest.skip("redis-server is not on PATH (apt-get install -y redis-server)")
    with simulator() as url:
        for example in examples:
            run_console(example, tmp_path, url)


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    return mypy_strict(TYPED, tmp_path_factory.mktemp("mypy"))


@pytest.mark.parametrize("example", TYPED, ids=name)
def test_python_example_passes_mypy_strict(
    example: Example, mypy_errors: dict[str, list[str]]
) -> None:
    assert mypy_errors[example.name] == []


def test_the_readme_quick_start_is_among_the_examples() -> None:
    readme = [example for example in PYTHON if example.path.name == "README.md"]
    assert readme, "the README's quick start is not a runnable ```python block"
    assert "asyncio.run(main())" in readme[0].source


# The collector itself: a broken example fails, a marked one is skipped


def write_readme(root: Path, text: str) -> Path:
    path = root / "README.md"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_a_python_example_that_raises_fails_naming_its_file_and_line(tmp_path: Path) -> None:
    write_readme(tmp_path, "# Doc\n\n```python\nprint(undefined_name)\n```\n")
    [example] = collect(tmp_path)
    with pytest.raises(ExampleFailed, match=r"README\.md:3: the script exited 1(.|\n)*NameError"):
        run_python(example, tmp_path)


def test_a_python_example_with_top_level_await_fails(tmp_path: Path) -> None:
    write_readme(tmp_path, "```python\nimport asyncio\nawait asyncio.sleep(0)\n```\n")
    [example] = collect(tmp_path)
    with pytest.raises(ExampleFailed, match="SyntaxError"):
        run_python(example, tmp_path)


def test_a_python_example_that_works_passes(tmp_path: Path) -> None:
    write_readme(tmp_path, "```python\nprint('hello')\n```\n")
    [example] = collect(tmp_path)
    assert run_python(example, tmp_path).stdout == "hello\n"


def test_a_console_block_stops_at_the_first_failing_command(tmp_path: Path) -> None:
    write_readme(
        tmp_path,
        """\
        ```console
        $ printf 'number\\n+5511987654321\\n' > in.csv
        sample output, never run
        $ dispatch-async send template --template-id no-such-option --bogus
        $ touch never-reached
        ```
        """,
    )
    [example] = collect(tmp_path)
    with simulator() as url, pytest.raises(ExampleFailed, match=r"README\.md:1: a command"):
        run_console(example, tmp_path, url)
    assert (tmp_path / "in.csv").exists()
    assert not (tmp_path / "never-reached").exists()


def test_what_a_failed_console_block_left_running_is_stopped(tmp_path: Path) -> None:
    write_readme(tmp_path, "```console\n$ sleep 300 &\n$ echo $! > pid\n$ false\n```\n")
    [example] = collect(tmp_path)
    with pytest.raises(ExampleFailed):
        run_console(example, tmp_path, "http://127.0.0.1:9")
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, "the block's background process still runs"
        time.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its reaper counts as stopped.
    with contextlib.suppress(OSError):
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:3]
    return True


def test_a_console_block_runs_the_cli_against_the_simulator(tmp_path: Path) -> None:
    write_readme(
        tmp_path,
        """\
        ```console
        $ printf 'number\\n+5511987654321\\n' > in.csv
        $ dispatch-async send template --template-id pix_reminder -i in.csv -o out.jsonl -q
        $ grep -c '"outcome": *"sent"' out.jsonl
        1
        ```
        """,
    )
    [example] = collect(tmp_path)
    with simulator() as url:
        run_console(example, tmp_path, url)
    assert '"sent"' in (tmp_path / "out.jsonl").read_text()


def test_a_documents_console_blocks_are_run_in_order_in_one_folder(tmp_path: Path) -> None:
    write_readme(
        tmp_path,
        """\
        ```console
        $ echo first > made-above
        ```

        ```console
        $ grep -q first made-above
        ```
        """,
    )
    [(document, examples)] = in_documents(collect(tmp_path)).items()
    assert (document, [example.line for example in examples]) == ("README.md", [1, 5])
    folder = tmp_path / "reader"
    folder.mkdir()
    for example in examples:
        run_console(example, folder, "http://127.0.0.1:9")
    with pytest.raises(ExampleFailed, match=r"README\.md:5"):
        run_console(examples[1], tmp_path, "http://127.0.0.1:9")  # another folder


def test_a_not_run_marker_skips_the_next_block_only(tmp_path: Path) -> None:
    write_readme(
        tmp_path,
        """\
        <!-- not-run: needs a real service -->
        ```python
        raise SystemExit(1)
        ```

        ```python
        print("runs")
        ```

        ```bash
        false
        ```
        """,
    )
    examples = parse(tmp_path / "README.md")
    assert [(e.line, e.not_run) for e in examples] == [
        (2, "needs a real service"),
        (6, None),
        (10, None),
    ]
    assert [e.line for e in collect(tmp_path)] == [6]


def test_a_not_run_marker_must_give_a_reason(tmp_path: Path) -> None:
    write_readme(tmp_path, "<!-- not-run: -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="must say why"):
        collect(tmp_path)


def test_an_unclosed_fence_is_an_error(tmp_path: Path) -> None:
    write_readme(tmp_path, "```python\nprint(1)\n")
    with pytest.raises(ValueError, match="never closed"):
        collect(tmp_path)


def test_a_badly_typed_example_fails_mypy_strict_at_its_markdown_line(tmp_path: Path) -> None:
    write_readme(tmp_path, "text\n\n```python\ndef f(x):\n    return x\n```\n")
    [example] = collect(tmp_path)
    errors = mypy_strict([example], tmp_path)
    assert any("README.md:4:" in line and "annotation" in line for line in errors[example.name])


# The API reference


REFERENCE_ENTRY = re.compile(r"^::: (?P<name>dispatch_async(\.\w+)+)\s*$", re.MULTILINE)


def test_the_reference_documents_every_public_name_and_nothing_else() -> None:
    modules = (
        dispatch_async,
        dispatch_async.testing,
        dispatch_async.instrumentation,
        dispatch_async.callbacks,
    )
    public = {f"{module.__name__}.{member}" for module in modules for member in module.__all__}
    documented = [
        match["name"]
        for page in sorted((PROJECT_ROOT / "docs" / "reference").glob("*.md"))
        for match in REFERENCE_ENTRY.finditer(page.read_text(encoding="utf-8"))
    ]
    assert sorted(public - set(documented)) == [], "public but not in docs/reference/"
    pages_of_modules = {module.__name__ for module in modules}  # their docstrings, no members
    assert sorted(set(documented) - public - pages_of_modules) == [], "documented, not public"
    assert len(documented) == len(set(documented)), "documented twice"


def test_a_fresh_machine_needs_two_commands_in_a_venv_and_ci_runs_the_test_one() -> None:
    readme = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    ci = (PROJECT_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    section = readme.split("## On a fresh machine", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, commands
    demo, test = commands
    # The newest Python first (tools/provision_python314.sh: Debian's apt has none).
    provision = "tools/provision_python314.sh && "
    assert test.startswith(provision), test
    # Debian's system Python refuses pip install outside a virtual environment (PEP 668).
    for command in (demo, test.removeprefix(provision)):
        assert command.startswith("python3 -m venv .venv && .venv/bin/pip install "), command
        assert " pip install" not in command.replace(".venv/bin/pip install", ""), command
    assert demo.endswith(" && .venv/bin/dispatch-async demo")
    assert test.endswith(" && .venv/bin/nox -s tests-3.11 compat lint typecheck docs release")
    assert test in ci


def test_ci_runs_the_oldest_python_in_full_and_the_newest_too() -> None:
    noxfile = (PROJECT_ROOT / "noxfile.py").read_text(encoding="utf-8")
    ci = (PROJECT_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    found = re.search(r"^PYTHONS = (\[.*\])$", noxfile, re.MULTILINE)
    assert found, "noxfile.py names every supported Python in PYTHONS"
    pythons = ast.literal_eval(found[1])
    pyproject = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["requires-python"] == f">={pythons[0]}"
    assert pythons == sorted(pythons, key=lambda version: tuple(map(int, version.split("."))))
    assert f"nox -s tests-{pythons[0]} compat " in ci
    assert "@nox.session(python=PYTHONS[-1])\ndef compat(" in noxfile
    classifiers = set(pyproject["project"]["classifiers"])
    assert {f"Programming Language :: Python :: {version}" for version in pythons} <= classifiers
