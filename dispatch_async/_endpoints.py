"""The token endpoint's path, and the four dispatch endpoints with the fields each one
requires (spec 4.1 to 4.5).

Which fields an endpoint *refuses* is decided by the signatures of the session's
``send_*`` methods: a field an endpoint does not take is not a parameter there.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable

import attrs
from yarl import URL

from ._exceptions import InputError, NetworkConfigurationError
from ._models import Fallback
from ._wire import Envelope, encodable

__all__ = [
    "BASIC",
    "BASIC_TEXT_MAX_BYTES",
    "SINGLE",
    "TEMPLATE",
    "TOKEN_PATH",
    "WEBHOOK",
    "Endpoint",
    "basic_text_warning",
    "envelope",
    "token_not_found",
]

#: The most text an RCS *basic* message carries, in UTF-8 bytes: Google's RBM billing
#: category for text-only messages (the vendor does not document a limit: inferred).
BASIC_TEXT_MAX_BYTES = 160


#: Where the access token is asked for, under the base URL (spec 4.1).
TOKEN_PATH = "/oauth/token"  # noqa: S105 - a path, not a secret


def token_not_found(url: URL) -> NetworkConfigurationError:
    """The error for a 404 from the token endpoint at *url*: the base URL is not the
    service's root (the secret was not refused). Said without the SDK's parameter names,
    so the command line can show it as it is.
    """
    root = url.path.removesuffix(TOKEN_PATH).rstrip("/")
    if root.endswith("/api/v3"):
        fix = "leave /api/v3 out of it: it is added to every request's path"
    else:
        fix = (
            "it should be the service's root; behind a reverse proxy, with the prefix the "
            "proxy serves the service under, such as /rcs"
        )
    return NetworkConfigurationError(
        f"the token endpoint {url} was not found (HTTP 404): the base URL looks wrong ({fix})",
        host=url.host,
    )


@attrs.frozen
class Endpoint:
    """A dispatch endpoint: its path and the field it cannot do without."""

    name: str
    path: str
    requires: str


WEBHOOK = Endpoint("webhook", "/api/v3/webhook", requires="webhook")
TEMPLATE = Endpoint("template", "/api/v3/template", requires="template_id")
# The spec shows no difference between basic and single: the same body to another path.
# In RCS Business Messaging, basic is text only (at most BASIC_TEXT_MAX_BYTES), single
# is longer text or rich content, and webhook/template are conversational (a 24 h session).
BASIC = Endpoint("basic", "/api/v3/basic", requires="text")
SINGLE = Endpoint("single", "/api/v3/single", requires="text")


def basic_text_warning(text: str) -> str | None:
    """Why *text* may not go as an RCS basic message, or None when it fits.

    Basic carries text of at most `BASIC_TEXT_MAX_BYTES` UTF-8 bytes; longer text is
    ``send_single``'s. Only a warning: the limit is the RBM category's, inferred for this
    service, and an account's provisioning decides what it accepts.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size <= BASIC_TEXT_MAX_BYTES:
        return None
    return (
        f"the text is {size} UTF-8 bytes: an RCS basic message carries at most "
        f"{BASIC_TEXT_MAX_BYTES}, so the service may refuse it or bill it as single "
        "(use send_single for longer text)"
    )


def envelope(
    endpoint: Endpoint,
    *,
    account: str | None,
    campaign_name: str | None = None,
    fallback: Fallback | Iterable[Fallback] | None = None,
    text: str | None = None,
    callback: str | None = None,
    template_id: str | None = None,
    webhook: str | None = None,
) -> Envelope:
    """Check a dispatch's fields for *endpoint* and build its envelope; raises InputError."""
    fields = {
        "account": account,
        "campaign_name": campaign_name,
        "text": text,
        "callback": callback,
        "template_id": template_id,
        "webhook": webhook,
    }
    if account is None:
        raise InputError("account is required: pass account= here or to the session")
    if fields[endpoint.requires] is None:
        raise InputError(f"send_{endpoint.name} requires {endpoint.requires}=")
    for name, value in fields.items():
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InputError(f"{name} must be a non-empty string, not {value!r}")
        if value is not None and not value.isascii() and not encodable(value):
            raise InputError(f"{name} has text that is not valid UTF-8 (a lone surrogate)")
    for name in ("callback", "webhook"):
        if (problem := _url_problem(fields[name])) is not None:
            # Never the value: a callback URL carries its receiver's key.
            raise InputError(f"{name} must be an http or https URL with a host: {problem}")
    return Envelope(
        account=str(account),
        campaign_name=campaign_name,
        fallback=_fallbacks(fallback),
        text=text,
        callback=callback,
        template_id=template_id,
        webhook=webhook,
    )


def _url_problem(url: str | None) -> str | None:
    """What keeps *url* from being one the service can call back; None if nothing."""
    if url is None:
        return None
    try:
        parts = urllib.parse.urlsplit(url.strip())
        host = parts.hostname
    except ValueError:
        return "the value given is not a URL"
    if parts.scheme.lower() not in ("http", "https"):
        return "the value given has no http:// or https:// scheme"
    if not host:
        return "the value given has no host"
    return None


def _fallbacks(fallback: Fallback | Iterable[Fallback] | None) -> tuple[Fallback, ...] | None:
    if fallback is None:
        return None
    items = (fallback,) if isinstance(fallback, Fallback) else tuple(fallback)
    for index, item in enumerate(items):
        if not isinstance(item, Fallback):
            raise InputError(
                f"fallback[{index}] must be a Fallback (e.g. Fallback.sms(text)), "
                f"not {type(item).__name__}"
            )
        if (
            not isinstance(item.channel, str)
            or not isinstance(item.content, str)
            or not item.content
        ):
            raise InputError(f"fallback[{index}] needs a channel and non-empty content strings")
        if not encodable((item.channel, item.content)):
            raise InputError(f"fallback[{index}] has text that is not valid UTF-8")
    return items or None
