"""The SDK's messages in the command line's words: its flags and environment variables.

The SDK says what is wrong in the names of its own parameters (``base_url``,
``token_request``) or of no setting at all ("the base URL looks wrong", "a private CA
must be added"); a person at the command line sets them with flags and variables. Every
SDK error a command shows passes through `in_our_words`, once, here.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["BASE_URL", "CA_FILE", "PROXY", "in_our_words"]

BASE_URL: Final = "--base-url (DISPATCH_BASE_URL)"
_PROXY_FLAG: Final = "--proxy (DISPATCH_PROXY)"
PROXY: Final = "--proxy (DISPATCH_PROXY, else HTTPS_PROXY)"
CA_FILE: Final = "--ca-file (DISPATCH_CA_FILE)"
_SECRET_AT: Final = "DISPATCH_CLIENT_SECRET or --client-secret-file"  # noqa: S105 - names

#: What the SDK says, and what the command line says instead. Each is a phrase of one
#: SDK message (tests/cli/screen/test_flags.py holds them to the SDK's real messages).
_PHRASES: Final = tuple(
    (re.compile(sdk), ours)
    for sdk, ours in (
        (r"^base_url ", f"{BASE_URL} "),
        (r"^proxy is not", f"{_PROXY_FLAG} is not"),
        (r"; pass client_secret$", f"; put the secret in {_SECRET_AT}"),
        (
            r"check the client secret, base_url and token_request",
            f"check the client secret ({_SECRET_AT}) and {BASE_URL}",
        ),
        (r"the base URL looks wrong", f"{BASE_URL} looks wrong"),
        (r"\(a private CA must be added to the trusted ones\)", f"({CA_FILE} adds a private CA)"),
        (r"\(is it an https port\?\)", f"(is {BASE_URL} an https port?)"),
        (r"the ones given in the proxy URL", f"the ones given in {PROXY}"),
        (r"^(the host name .* does not resolve .*)$", rf"\1 (check {BASE_URL})"),
        (r"^(the proxy's host name .* does not resolve .*)$", rf"\1 (check {PROXY})"),
    )
)


def in_our_words(error: object) -> str:
    """*error*'s message with the command line's flags for the SDK's parameters."""
    text = str(error)
    for phrase, ours in _PHRASES:
        text = phrase.sub(ours, text)
    return text
