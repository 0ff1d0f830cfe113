"""The way to the service: which proxy a session's requests go through, and whom it trusts.

Read once, when a session is made, from its arguments or else from the environment, as
requests and httpx do: ``HTTPS_PROXY``/``HTTP_PROXY`` (either case) unless ``NO_PROXY``
names the host, and ``SSL_CERT_FILE``/``SSL_CERT_DIR``. aiohttp's own ``trust_env`` is not
used: it also reads ``~/.netrc``, and would send the password it finds there for the
service's host as Basic credentials (with the token request's secret) or fail every
request that carries our bearer token ("Cannot combine AUTHORIZATION header").
"""

from __future__ import annotations

import base64
import functools
import os
import ssl
import urllib.request
from collections.abc import Mapping
from typing import Final

import attrs
from yarl import URL

from ._exceptions import ConfigurationError

__all__ = ["Route", "route_to", "ssl_context"]

_PROXY_SCHEMES: Final = ("http", "https")
_CA_VARIABLES: Final = ("SSL_CERT_FILE", "SSL_CERT_DIR")


@attrs.frozen
class Route:
    """How requests reach the service: through *proxy* or not, trusting *ssl*.

    *tls* is an ``SSLContext``, or True for the aiohttp session's own default.
    """

    proxy: URL | None = None
    proxy_headers: Mapping[str, str] | None = attrs.field(default=None, repr=False)
    """``Proxy-Authorization``, from the credentials in the proxy's URL."""
    tls: ssl.SSLContext | bool = True

    @property
    def proxy_name(self) -> str | None:
        """The proxy as ``host:port``, never its credentials; None without one."""
        return None if self.proxy is None else f"{self.proxy.host}:{self.proxy.port}"


def route_to(
    base_url: URL,
    *,
    proxy: str | URL | None,
    trust_env: bool,
    tls: ssl.SSLContext | None,
    own_session: bool,
) -> Route:
    """The route to *base_url*: the arguments given, else (*trust_env*) the environment's.

    A caller's own aiohttp session (*own_session* False) keeps its own settings for
    whatever is not given here: its ``trust_env``, its connector's TLS.
    """
    address: URL | None
    if proxy is not None:
        address, auth = _proxy_url(proxy, "proxy")
    elif trust_env and own_session:
        address, auth = _proxy_from_env(base_url)
    else:
        address, auth = None, None
    if tls is None:
        tls_used: ssl.SSLContext | bool = True
        if trust_env and own_session and base_url.scheme == "https":
            tls_used = _context_from_env(*(os.environ.get(name) for name in _CA_VARIABLES))
    else:
        tls_used = tls
    return Route(address, auth, tls_used)


def ssl_context(
    ca_file: str | os.PathLike[str] | None = None,
    *,
    ca_dir: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """The system's trusted CAs plus *ca_file* (PEM, one CA or more) and *ca_dir*: pass it
    as ``ssl=`` to trust a private CA as well as the public ones.

    The system's CAs are those ``SSL_CERT_FILE``/``SSL_CERT_DIR`` name when set, read now.
    *ca_dir* is a directory prepared with ``openssl rehash``. Raises `ConfigurationError`
    naming a file that cannot be read or holds no certificate.
    """
    context = ssl.create_default_context()
    context.set_alpn_protocols(("http/1.1",))  # as aiohttp's own context
    for path, is_dir in ((ca_file, False), (ca_dir, True)):
        if path is None:
            continue
        try:
            if is_dir:
                context.load_verify_locations(capath=path)
            else:
                context.load_verify_locations(cafile=path)
        except ssl.SSLError:  # an OSError too: first
            raise ConfigurationError(
                f"the CA file {os.fspath(path)!r} holds no PEM certificate"
            ) from None
        except OSError as exc:
            raise ConfigurationError(
                f"the CA {'directory' if is_dir else 'file'} {os.fspath(path)!r} cannot be "
                f"read: {exc.strerror or exc}"
            ) from None
    return context


@functools.lru_cache(maxsize=4)
def _context_from_env(cafile: str | None, capath: str | None) -> ssl.SSLContext | bool:
    """A context that reads SSL_CERT_FILE/SSL_CERT_DIR as they are now (keyed by them).

    aiohttp builds its default context once, when it is imported, so without this a
    variable set later would be ignored. Loading the CAs takes tens of milliseconds: one
    context per value, shared by every session.
    """
    if cafile is None and capath is None:
        return True
    return ssl_context()


def _proxy_from_env(base_url: URL) -> tuple[URL | None, Mapping[str, str] | None]:
    value = urllib.request.getproxies_environment().get(base_url.scheme)
    # With proxies in the environment, proxy_bypass reads NO_PROXY (on every system).
    if not value or urllib.request.proxy_bypass(base_url.host or ""):
        return None, None
    return _proxy_url(value, f"{base_url.scheme.upper()}_PROXY")


def _proxy_url(value: str | URL, name: str) -> tuple[URL, Mapping[str, str] | None]:
    """The proxy's URL without credentials, and the header that carries them (aiohttp's
    BasicAuth is deprecated). *name* is for messages, which never quote the value: it
    may hold a password."""
    text = str(value)
    if "://" not in text:  # "proxy:3128", as curl and requests take it
        text = f"http://{text}"
    try:
        url = URL(text)
    except (TypeError, ValueError):
        url = None
    if url is None or url.scheme not in _PROXY_SCHEMES or not url.host:
        raise ConfigurationError(
            f"{name} is not a proxy URL: it should look like http://proxy.example.com:3128"
        )
    auth = None
    if url.user is not None or url.password is not None:
        pair = f"{url.user or ''}:{url.password or ''}".encode()
        auth = {"Proxy-Authorization": f"Basic {base64.b64encode(pair).decode('ascii')}"}
    return url.with_user(None).with_path("").with_query(None).with_fragment(None), auth
