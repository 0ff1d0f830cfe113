"""The installed version, read from the package metadata so it is never edited by hand."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dispatch-async")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0+unknown"
