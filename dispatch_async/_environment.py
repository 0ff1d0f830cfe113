"""Configuration from the environment, read the same way by every client class."""

from __future__ import annotations

import os
from typing import Any

from ._exceptions import ConfigurationError

__all__ = ["settings_from_env"]

_VARIABLES = (
    ("base_url", "DISPATCH_BASE_URL"),
    ("client_secret", "DISPATCH_CLIENT_SECRET"),
    ("account", "DISPATCH_ACCOUNT"),
)
_REQUIRED = ("base_url", "client_secret")


def settings_from_env(overrides: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The base URL and the keyword arguments of a client, *overrides* taking precedence.

    DISPATCH_BASE_URL and DISPATCH_CLIENT_SECRET are required (unless given), and a
    missing one is named; DISPATCH_ACCOUNT is optional. Empty variables count as unset.
    """
    settings: dict[str, Any] = {}
    for name, variable in _VARIABLES:
        value = os.environ.get(variable)
        if value:
            settings[name] = value
    settings.update(overrides)
    for name, variable in _VARIABLES:
        if name in _REQUIRED and name not in settings:
            raise ConfigurationError(f"{variable} is not set (or pass {name}=)")
    base_url: str = settings.pop("base_url")
    return base_url, settings
