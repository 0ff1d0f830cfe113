"""The built documentation site: readable from disk with no network, and a complete reference.

One ``mkdocs build --strict`` (about ten seconds) serves every test in this module; each
test reads the built files as a browser opened on ``file://`` would get them.
"""

from __future__ import annotations

import enum
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import attrs
import pytest

import dispatch_async
import dispatch_async.callbacks
import dispatch_async.instrumentation
import dispatch_async.testing

from .markdown_examples import PROJECT_ROOT

PUBLIC_MODULES = (
    dispatch_async,
    dispatch_async.callbacks,
    dispatch_async.instrumentation,
    dispatch_async.testing,
)
#: Public classes that callers receive, never construct: no constructor is shown.
NOT_CONSTRUCTED = {
    "dispatch_async.ValidMessages",
    "dispatch_async.InvalidMessages",
    "dispatch_async.testing.Fault",  # built with its constructors: Fault.status(503), ...
}


#: The elements a signature block nests (all with closing tags).
NESTING = frozenset({"div", "pre", "code", "span", "a", "p", "h1", "h2", "h3", "h4", "h5", "h6"})


class Page(HTMLParser):
    """What a page links to and loads, and its reference entries' signatures and text."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.ids: set[str] = set()
        self.signatures: dict[str, str] = {}
        self.text: list[str] = []
        self._object: str | None = None
        self._signature_depth = 0  # > 0 inside a signature block
        self._skip = 0  # inside <script>/<style>
        self.feed(path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        for name in ("src", "href"):
            if found.get(name):
                self.urls.append((tag, name, found[name] or ""))
        classes = (found.get("class") or "").split()
        if found.get("id"):
            self.ids.add(found["id"] or "")
            if "doc-heading" in classes:
                self._object = found["id"]
        if tag in ("script", "style"):
            self._skip += 1
        if tag in NESTING:
            if self._signature_depth:
                self._signature_depth += 1
            elif tag == "div" and "doc-signature" in classes and self._object:
                self._signature_depth = 1
                self.signatures[self._object] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip -= 1
        if tag in NESTING and self._signature_depth:
            self._signature_depth -= 1

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        self.text.append(data)
        if self._signature_depth and self._object:
            self.signatures[self._object] += data


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for this module as ``nox -s docs`` builds it."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(PROJECT_ROOT)}
    built = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return out


def site_search(site: Path, *queries: str) -> dict[str, list[str]]:
    """The pages the built site's search shows for each query, best first (node runs it)."""
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("CI must provide node (see .ci/run: Debian's nodejs)")
        pytest.skip("node is not on PATH (apt-get install -y nodejs)")
    done = subprocess.run(  # noqa: S603 - node, our script, the built site
        [node, str(Path(__file__).with_name("site_search.js")), str(site), *queries],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, list[str]] = json.loads(done.stdout)
    return found


@pytest.fixture(scope="module")
def pages(site: Path) -> dict[Path, Page]:
    return {path.relative_to(site): Page(path) for path in sorted(site.rglob("*.html"))}


class Reference:
    """Every reference page's anchors, signatures (by object path) and text, together."""

    def __init__(self, pages: list[Page]) -> None:
        self.ids = {anchor for page in pages for anchor in page.ids}
        self.signatures = {path: shown for page in pages for path, shown in page.signatures.items()}
        self.text = [text for page in pages for text in page.text]


@pytest.fixture(scope="module")
def reference(pages: dict[Path, Page]) -> Reference:
    return Reference([page for path, page in pages.items() if path.parts[0] == "reference"])


# -- the site works from disk, with no network -----------------------------------


class TestTheNavigation:
    def test_every_page_is_in_the_menu_once(self) -> None:
        config = (PROJECT_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
        listed = re.findall(r"^\s+- (?:.+: )?(\S+\.md)\s*$", config, re.MULTILINE)
        assert listed, "no page found in mkdocs.yml's nav"
        twice = sorted({page for page in listed if listed.count(page) > 1})
        assert not twice, f"listed twice in the menu: {twice}"
        pages = {
            str(path.relative_to(PROJECT_ROOT / "docs"))
            for path in (PROJECT_ROOT / "docs").rglob("*.md")
        }
        assert set(listed) == pages, (sorted(pages - set(listed)), sorted(set(listed) - pages))


class TestTheSiteWorksFromDisk:
    def test_every_page_links_to_files_not_folders(
        self, site: Path, pages: dict[Path, Page]
    ) -> None:
        assert len(pages) > 20
        for path, page in pages.items():
            if path.name == "404.html":
                continue  # only a web server shows it, at any depth: its links are absolute
            for tag, _, url in page.urls:
                if tag != "a" or re.match(r"[a-z]+:", url):
                    continue
                target = url.split("#")[0]
                if not target:
                    continue  # an anchor on the same page
                assert not target.endswith("/"), f"{path} links to the folder {url}"
                assert (site / path.parent / target).resolve().is_file(), f"{path}: {url}"

    def test_search_runs_from_the_files_with_its_index(
        self, site: Path, pages: dict[Path, Page]
    ) -> None:
        index = (site / "search" / "search_index.js").read_text(encoding="utf-8")
        assert index.startswith("var __index = ")  # a script: file:// cannot fetch JSON
        assert "DispatchSession" in index
        assert "send_template" in index
        for path, page in pages.items():
            if path.name == "404.html":
                continue
            shims = [url for tag, _, url in page.urls if tag == "script" and "iframe-worker" in url]
            assert len(shims) == 1, f"{path} loads no worker shim for file://"
            assert (site / path.parent / shims[0]).resolve().is_file()

    def test_a_search_finds_the_guides_before_the_changelog(self, site: Path) -> None:
        # The changelog names everything, in titles too: found only after the pages that
        # explain (its front matter's search boost), here by the site's own search code.
        queries = ("maybe_sent", "DispatchClient", "reconcile", "resume")
        found = site_search(site, *queries)
        for query in queries:
            pages = found[query]
            assert pages[0] != "changelog.html", (query, pages)
            assert "changelog.html" not in pages[:2], (query, pages)

    def test_a_command_line_option_finds_its_guide(self, site: Path) -> None:
        # Typed as the software prints it ("--resume sends the not_sent ones again"): the
        # search reads a leading "-" as "must not contain", and "--resume" found nothing.
        found = site_search(site, "--resume", "resume", "-resume")
        assert found["--resume"][:1] == ["guides/command-line.html"]
        assert found["--resume"] == found["resume"]
        assert found["-resume"] != found["resume"]  # one dash still means "without"

    def test_no_page_loads_or_links_anything_from_another_host(
        self, pages: dict[Path, Page]
    ) -> None:
        for path, page in pages.items():
            remote = [url for _, _, url in page.urls if re.match(r"(https?:)?//", url)]
            assert remote == [], path


# -- the API reference -----------------------------------------------------------


def public_objects() -> Iterator[tuple[str, Any]]:
    for module in PUBLIC_MODULES:
        for name in module.__all__:
            yield f"{module.__name__}.{name}", getattr(module, name)


def public_classes() -> list[tuple[str, type]]:
    return [(path, obj) for path, obj in public_objects() if isinstance(obj, type)]


def constructed(path: str, cls: type) -> bool:
    """Whether callers build *cls* (not a protocol, a TypedDict, an enum or a result part)."""
    kind = issubclass(cls, dict | enum.Enum) or getattr(cls, "_is_protocol", False)
    return not (kind or path in NOT_CONSTRUCTED)


def parameters(signature: str) -> list[str]:
    """``f(a: int, *, b: str = ",") -> X`` as ["a", "*", "b"]: names and markers."""
    inside = signature[signature.index("(") + 1 :]
    parts, depth, current, quote = [], 0, "", ""
    for char in inside:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    parts.append(current)
    return [re.split(r"[:=]", part)[0].strip() for part in parts if part.strip()]


def runtime_parameters(callable_: Any) -> list[str]:
    shown: list[str] = []
    marked = False
    for parameter in inspect.signature(callable_).parameters.values():
        kind = parameter.kind
        if kind is parameter.VAR_POSITIONAL:
            marked = True
            shown.append(f"*{parameter.name}")
        elif kind is parameter.VAR_KEYWORD:
            shown.append(f"**{parameter.name}")
        else:
            if kind is parameter.KEYWORD_ONLY and not marked:
                marked = True
                shown.append("*")
            shown.append(parameter.name)
    if "/" not in shown and any(
        p.kind is p.POSITIONAL_ONLY for p in inspect.signature(callable_).parameters.values()
    ):
        shown.insert(
            sum(
                p.kind is p.POSITIONAL_ONLY
                for p in inspect.signature(callable_).parameters.values()
            ),
            "/",
        )
    return shown


def public_methods(cls: type) -> Iterator[tuple[str, Any]]:
    """The public methods *cls* defines or inherits from this package, unbound."""
    seen: set[str] = set()
    for base in cls.__mro__:
        if not base.__module__.startswith("dispatch_async"):
            continue
        for name, value in vars(base).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(value, classmethod | staticmethod):
                yield name, getattr(cls, name)
            elif inspect.isfunction(value) or callable(getattr(value, "__wrapped__", None)):
                yield name, value


def public_attributes(cls: type) -> set[str]:
    """Fields, annotated class attributes and properties of *cls* from this package."""
    names: set[str] = set()
    for base in cls.__mro__:
        if not base.__module__.startswith("dispatch_async"):
            continue
        names |= set(vars(base).get("__annotations__", {}))
        names |= {n for n, v in vars(base).items() if isinstance(v, property)}
    if attrs.has(cls):
        names |= {field.name for field in attrs.fields(cls)}
    return {name for name in names if not name.startswith("_")}


class TestTheReference:
    def test_every_public_function_shows_its_real_signature(self, reference: Reference) -> None:
        functions = [(p, o) for p, o in public_objects() if isinstance(o, types.FunctionType)]
        assert len(functions) >= 6
        for path, function in functions:
            assert path in reference.signatures, f"{path} has no signature"
            shown = reference.signatures[path]
            assert parameters(shown) == runtime_parameters(function), path
            if function.__annotations__.get("return"):
                assert "->" in shown, f"{path} shows no return type"

    def test_every_public_class_shows_its_constructor(self, reference: Reference) -> None:
        for path, cls in public_classes():
            if not constructed(path, cls):
                assert path not in reference.signatures, path
                continue
            assert path in reference.signatures, f"{path} shows no constructor"
            assert parameters(reference.signatures[path]) == runtime_parameters(cls), path

    def test_every_public_method_shows_its_real_signature(self, reference: Reference) -> None:
        checked = set()
        for path, cls in public_classes():
            for name, method in public_methods(cls):
                entry = f"{path}.{name}"
                assert entry in reference.signatures, f"{entry} has no signature"
                shown = parameters(reference.signatures[entry])
                expected = runtime_parameters(method)
                if expected[:1] in (["self"], ["cls"]):
                    expected = expected[1:]
                assert shown == expected, entry
                checked.add(entry)
        for twin in ("send_template", "stream_basic", "check_credentials"):
            assert f"dispatch_async.DispatchClient.{twin}" in checked
            assert f"dispatch_async.DispatchSession.{twin}" in checked

    def test_the_session_sends_with_coroutines_and_the_client_blocks(
        self, reference: Reference
    ) -> None:
        session = reference.signatures["dispatch_async.DispatchSession.send_template"]
        client = reference.signatures["dispatch_async.DispatchClient.send_template"]
        assert "template_id: str" in session
        assert session.rstrip().endswith("-> DispatchResult")
        assert client.rstrip().endswith("-> DispatchResult")
        stream = reference.signatures["dispatch_async.DispatchClient.stream_template"]
        assert stream.rstrip().endswith("-> Generator[DispatchResult, None, None]")

    def test_signatures_are_formatted_one_parameter_a_line(self, reference: Reference) -> None:
        for path, shown in reference.signatures.items():
            assert max(len(line) for line in shown.splitlines()) <= 100, path
        constructor = reference.signatures["dispatch_async.DispatchSession"]
        assert "\n    client_secret: str,\n" in constructor

    def test_every_public_attribute_is_documented(self, reference: Reference) -> None:
        paths = {cls: path for path, cls in public_classes()}
        for path, cls in public_classes():
            if issubclass(cls, dict):
                continue  # a TypedDict: its keys are BatchSettings' fields
            for name in public_attributes(cls):
                # Documented where it is defined, if that class is public too.
                owner = next(
                    (
                        c
                        for c in reversed(cls.__mro__)
                        if c in paths and name in public_attributes(c)
                    ),
                    cls,
                )
                assert f"{paths[owner]}.{name}" in reference.ids, f"{path}.{name} is undocumented"

    def test_results_document_what_callers_read(self, reference: Reference) -> None:
        for name in (
            "DispatchResult.valid",
            "DispatchResult.invalid",
            "DispatchResult.failed",
            "Recipient.number",
            "Recipient.vars",
            "Recipient.ref",
            "ValidMessage.id",
            "ValidMessage.number",
            "ValidMessage.session_id",
            "InvalidMessage.reason",
            "FailedRecipient.error",
            "ValidMessages.ids",
            "InvalidMessages.reasons",
        ):
            assert f"dispatch_async.{name}" in reference.ids, name

    def test_no_private_name_shows(self, reference: Reference) -> None:
        text = "".join(reference.text)
        assert re.findall(r"(?<![\w/.])_[A-Za-z]\w*", text) == []
        internal = {
            name
            for module in _private_modules()
            for name, value in vars(module).items()
            if re.fullmatch(r"[A-Z][A-Z0-9_]+", name) and not isinstance(value, type)
        } - {name for module in PUBLIC_MODULES for name in module.__all__}
        assert internal, "the check found no internal constant to look for"
        shown = {name for name in internal if re.search(rf"\b{name}\b", text)}
        assert shown == set()
        assert "make: Callable" not in text

    def test_docstrings_read_as_prose(self, pages: dict[Path, Page]) -> None:
        for path, page in pages.items():
            text = "".join(page.text)
            assert not re.search(r"::\s*$", text, re.MULTILINE), f"{path}: a stray '::'"
            if path.name != "changelog.html":  # what was said then
                assert not re.search(r"\bspec\b", text, re.IGNORECASE), f"{path} cites the spec"


def _private_modules() -> Iterator[types.ModuleType]:
    for name, module in sorted(sys.modules.items()):
        private = any(part.startswith("_") for part in name.split(".")[1:])
        if name.startswith("dispatch_async.") and "._cli" not in name and private and module:
            yield module
