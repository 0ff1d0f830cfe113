"""Where the fleet's Redis is: the URL forms it takes, Sentinel's among them, and how
they are shown without a password."""

from __future__ import annotations

import urllib.parse

import attrs

from .._exceptions import ConfigurationError

__all__ = ["SENTINEL_SCHEMES", "SentinelAddress", "check_url", "parse_sentinel_url", "redacted_url"]

#: Plain, TLS, Unix socket; and a Sentinel-managed primary, plain or TLS.
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
_SCHEMES = ("redis", "rediss", "unix", *SENTINEL_SCHEMES)
_DEFAULT_SENTINEL_PORT = 26379


def check_url(redis_url: str) -> str:
    """*redis_url* if it is a Redis URL of a form the fleet takes, else a `ConfigurationError`."""
    if not isinstance(redis_url, str) or urllib.parse.urlsplit(redis_url).scheme not in _SCHEMES:
        raise ConfigurationError(
            "redis_url must be a redis://, rediss://, unix://, redis+sentinel:// or "
            "rediss+sentinel:// URL"
        )
    if urllib.parse.urlsplit(redis_url).scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(redis_url)
    return redis_url


def redacted_url(url: str) -> str:
    """*url* without its password, for reprs and log lines."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    credentials, _, hosts = parts.netloc.rpartition("@")
    user, colon, _ = credentials.partition(":")
    masked = f"{user}:***" if colon else user
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{masked}@{hosts}"))


@attrs.frozen
class SentinelAddress:
    """A primary found through Redis Sentinel: what `parse_sentinel_url` reads."""

    sentinels: tuple[tuple[str, int], ...]
    """The sentinels' (host, port) pairs, asked in turn."""
    service: str
    """The name the sentinels monitor the primary under (``sentinel monitor``)."""
    db: int = 0
    """The database number on the primary."""
    username: str | None = None
    """The primary's ACL user, or None."""
    password: str | None = attrs.field(default=None, repr=False)
    """The primary's password, or None (never in the repr)."""
    tls: bool = False
    """Whether sentinels and primary speak TLS (``rediss+sentinel://``)."""
    ssl_ca_certs: str | None = None
    """A CA file to verify their certificates with, or None (the system's)."""


def parse_sentinel_url(url: str) -> SentinelAddress:
    """Read ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``.

    ``rediss+sentinel://`` speaks TLS to sentinels and primary; ``?ssl_ca_certs=PATH``
    names the CA that signed their certificates. A port left out is 26379. The user and
    password are the primary's (the sentinels are asked without them).

    Raises:
        ConfigurationError: not a Sentinel URL of that form (the message never holds
            the password).
    """
    parts = urllib.parse.urlsplit(url)
    shown = redacted_url(url) if isinstance(url, str) else repr(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        raise ConfigurationError(f"{shown}: not a redis+sentinel:// or rediss+sentinel:// URL")
    credentials, _, hosts = parts.netloc.rpartition("@")
    sentinels = []
    for host in hosts.split(","):
        name, colon, port = host.rpartition(":") if ":" in host else (host, "", "")
        if not name or (colon and not port.isdigit()):
            raise ConfigurationError(f"{shown}: a sentinel is host:port, comma-separated")
        sentinels.append((name, int(port) if port else _DEFAULT_SENTINEL_PORT))
    path = [urllib.parse.unquote(p) for p in parts.path.split("/")[1:] if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigurationError(f"{shown}: the path is /service_name or /service_name/db")
    user, colon, password = credentials.partition(":")
    query = urllib.parse.parse_qs(parts.query)
    return SentinelAddress(
        sentinels=tuple(sentinels),
        service=path[0],
        db=int(path[1]) if len(path) == 2 else 0,
        username=urllib.parse.unquote(user) or None,
        password=urllib.parse.unquote(password) if colon else None,
        tls=parts.scheme == "rediss+sentinel",
        ssl_ca_certs=query.get("ssl_ca_certs", [None])[0],
    )
