"""What each argument of a session, its views and the blocking client must be: one table.

Every argument is checked where it is given (a constructor, ``with_options``, a call's
batch options), so a wrong type is a `ConfigurationError` naming the argument and the
type given, raised before anything is sent, never an ``AttributeError`` at the first
send. The values' own rules (a URL's scheme, a rate's bounds) stay with the code that
uses them.
"""

from __future__ import annotations

import difflib
import ssl
from collections.abc import Callable, Collection, Iterable, Mapping, Set

import aiohttp
import attrs
from yarl import URL

from ._auth import TOKEN_REQUESTS
from ._exceptions import ConfigurationError, UnknownArgumentError
from ._retry import RetryPolicy
from ._transport import has_control_characters

__all__ = ["ARGUMENTS", "check_arguments", "unknown_argument"]


@attrs.frozen
class Argument:
    """What an argument must be: *what* for the message, *accepts* to check it.

    ``optional``: None is accepted too. ``shown``: a wrong number or bool is quoted in
    the message (never for a credential).
    """

    what: str
    accepts: Callable[[object], bool]
    optional: bool = False
    shown: bool = True


def _instance(*types: type) -> Callable[[object], bool]:
    return lambda value: isinstance(value, types)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _text(value: object) -> bool:
    return isinstance(value, str) and bool(value)


def _with_methods(*names: str) -> Callable[[object], bool]:
    return lambda value: all(callable(getattr(value, name, None)) for name in names)


def _region(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:  # the extra that reads local numbers (prevalidate) knows every region
        from phonenumbers import SUPPORTED_REGIONS
    except ImportError:
        return len(value) == 2 and value.isascii() and value.isalpha() and value.isupper()
    return value in SUPPORTED_REGIONS


def _hooks(value: object) -> bool:
    # A one-shot iterator's hooks are checked as they are called (see instrumentation.emit).
    if not isinstance(value, Iterable) or isinstance(value, str | bytes):
        return False
    return not isinstance(value, Collection) or all(callable(hook) for hook in value)


ARGUMENTS: Mapping[str, Argument] = {
    # DispatchSession and DispatchClient
    "base_url": Argument("a URL string", _instance(str, URL)),
    "client_secret": Argument("a non-empty string", _text, shown=False),
    "account": Argument("a non-empty string or None", _text, optional=True),
    "timeout": Argument(
        "a positive number of seconds or an aiohttp.ClientTimeout",
        lambda value: isinstance(value, aiohttp.ClientTimeout) or _positive(value),
    ),
    "retry": Argument("a RetryPolicy or None", _instance(RetryPolicy), optional=True),
    "requests_per_second": Argument(
        'a positive number, "auto" or None',
        lambda value: value == "auto" or _positive(value),
        optional=True,
    ),
    "max_requests_per_second": Argument("a positive number or None", _positive, optional=True),
    "http_session": Argument(
        "an aiohttp.ClientSession or None", _instance(aiohttp.ClientSession), optional=True
    ),
    "user_agent": Argument(
        "a string without control characters, or None",
        lambda value: isinstance(value, str) and not has_control_characters(value),
        optional=True,
    ),
    "token_store": Argument(
        "a token store such as RedisTokenStore, or None",
        _with_methods("load", "save", "lock", "aclose"),
        optional=True,
    ),
    "rate_limiter": Argument(
        "a rate limiter such as RedisRateLimiter, or None",
        _with_methods("acquire", "aclose"),
        optional=True,
    ),
    "hooks": Argument("an iterable of hooks (callables), or None", _hooks, optional=True),
    "proxy": Argument(
        "a proxy URL such as http://proxy.example.com:3128, or None",
        _instance(str, URL),
        optional=True,
        shown=False,
    ),
    "trust_env": Argument("True or False", _instance(bool)),
    "ssl": Argument("an ssl.SSLContext or None", _instance(ssl.SSLContext), optional=True),
    "token_request": Argument(
        " or ".join(f'"{name}"' for name in TOKEN_REQUESTS),
        lambda value: value in TOKEN_REQUESTS,
    ),
    # BatchSettings: the session's, a view's and a call's
    "chunk_size": Argument("a positive integer", _count),
    "max_concurrency": Argument("a positive integer", _count),
    "dedupe": Argument("True or False", _instance(bool)),
    "prevalidate": Argument("True or False", _instance(bool)),
    "region": Argument(
        'a region code (ISO 3166 alpha-2, upper case) such as "BR", or None',
        _region,
        optional=True,
    ),
    "deadline": Argument("a positive number of seconds, or None", _positive, optional=True),
    "exclude": Argument(
        "a set of numbers (not a list: each lookup would read it all), a callable, or None",
        lambda value: isinstance(value, Set) or (callable(value) and not isinstance(value, type)),
        optional=True,
    ),
    "on_progress": Argument("a callable, or None", callable, optional=True),
    "on_chunk": Argument("a callable, or None", callable, optional=True),
    "before_send": Argument("a coroutine function, or None", callable, optional=True),
}


def check_arguments(arguments: Mapping[str, object]) -> None:
    """Raise ConfigurationError for the first argument that is not what `ARGUMENTS` says."""
    for name, value in arguments.items():
        argument = ARGUMENTS[name]
        if (value is None and argument.optional) or argument.accepts(value):
            continue
        given = type(value).__name__
        if argument.shown and isinstance(value, bool | int | float | str):
            given = f"{given} {value!r:.60}"
        raise ConfigurationError(f"{name} must be {argument.what}, not {given}")


def unknown_argument(
    function: Callable[..., object],
    name: str,
    also: Iterable[str] = (),
    siblings: Iterable[Callable[..., object]] = (),
) -> UnknownArgumentError:
    """The error for keyword *name*, which *function* does not take.

    Suggests the closest keyword it takes (its own, or *also*: the batch options), as
    click's "Did you mean" does; failing that, names the *siblings* that take *name*.
    """
    method = _shown_name(function)
    message = f"{method}() got an unexpected keyword argument {name!r}"
    close = difflib.get_close_matches(name, [*_keywords(function), *also], n=1)
    takers = [_shown_name(f) for f in siblings if name in _keywords(f)]
    if close:
        message += f"; did you mean {close[0]!r}?"
    elif takers:
        listed = ", ".join(takers[:-1]) + " and " if len(takers) > 1 else ""
        message += f" ({listed}{takers[-1]} take{'' if len(takers) > 1 else 's'} it)"
    return UnknownArgumentError(message)


def _keywords(function: Callable[..., object]) -> tuple[str, ...]:
    code = function.__code__
    return code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]


def _shown_name(function: Callable[..., object]) -> str:
    """``send_template``; a class's name for its ``__init__``."""
    qualname = function.__qualname__
    return qualname[: -len(".__init__")] if qualname.endswith(".__init__") else function.__name__
