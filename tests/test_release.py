"""What a release says about itself: one version everywhere, the Pythons it supports and
what it needs on each, and a readme that reads right on the package index.

`nox -s release` checks the built wheel itself (docs/guides/installation.md)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import dispatch_async

from .markdown_examples import PROJECT_ROOT

PYPROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VERSION = PYPROJECT["project"]["version"]


class TestTheVersion:
    def test_is_written_once_and_read_from_the_installed_metadata(self) -> None:
        assert importlib.metadata.version("dispatch-async") == VERSION
        assert dispatch_async.__version__ == VERSION

    def test_is_what_the_command_line_prints(self) -> None:
        script = Path(sys.executable).with_name("dispatch-async")
        done = subprocess.run(  # noqa: S603 - the package's own script
            [script, "--version"], capture_output=True, text=True, check=True, timeout=60
        )
        assert done.stdout == f"dispatch-async, version {VERSION}\n"

    def test_is_the_changelogs_top_entry(self) -> None:
        changelog = (PROJECT_ROOT / "docs" / "changelog.md").read_text(encoding="utf-8")
        top = re.search(r"^## (.*)$", changelog, re.MULTILINE)
        assert top is not None
        assert top[1].split()[0] == VERSION, top[0]


def requirement_of(name: str, python: str) -> Requirement:
    """The runtime requirement on *name* that applies on *python*."""
    (found,) = [
        requirement
        for requirement in map(Requirement, PYPROJECT["project"]["dependencies"])
        if requirement.name == name
        and (requirement.marker is None or requirement.marker.evaluate({"python_version": python}))
    ]
    return found


class TestPythonSupport:
    @pytest.mark.parametrize(
        ("name", "python", "oldest"),
        [
            # 3.14's lazy annotations: msgspec's structs read them from 0.20.0, cattrs
            # supports 3.14 from 25.3.0.
            ("msgspec", "3.14", "0.20.0"),
            ("cattrs", "3.14", "25.3.0"),
            ("msgspec", "3.11", "0.18"),
            ("cattrs", "3.11", "23.2"),
        ],
    )
    def test_each_python_gets_a_floor_known_to_work_on_it(
        self, name: str, python: str, oldest: str
    ) -> None:
        assert str(requirement_of(name, python).specifier) == f">={oldest}"

    def test_free_threaded_python_is_not_claimed(self) -> None:
        # orjson publishes no free-threaded wheels (docs/guides/installation.md).
        classifiers = PYPROJECT["project"]["classifiers"]
        assert [c for c in classifiers if "Free Threading" in c] == []


class TestThePackageIndexReadme:
    def test_has_no_relative_link_left(self) -> None:
        """pyproject's substitutions make the README's links to docs/ absolute: a link
        they miss would be dead on the package index."""
        hook = PYPROJECT["tool"]["hatch"]["metadata"]["hooks"]["fancy-pypi-readme"]
        (fragment,) = hook["fragments"]
        text = (PROJECT_ROOT / fragment["path"]).read_text(encoding="utf-8")
        for substitution in hook["substitutions"]:
            text = re.sub(substitution["pattern"], substitution["replacement"], text)
        links = re.findall(r"\]\(([^)]*)\)", text)
        assert links, "the README links to the documentation"
        assert [link for link in links if not link.startswith(("https://", "#"))] == []
