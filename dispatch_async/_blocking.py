"""``DispatchClient``: the SDK for synchronous code (Celery, Django, threads, scripts).

A blocking call cannot start an event loop of its own each time (a new loop means a new
session, so a new token, per call) nor reuse a session across loops. The client runs
one `DispatchSession` on one event loop in a background thread, per process, and hands
each call to it through anyio's ``BlockingPortal``: every thread shares one token and
one connection pool. A forked child (Celery's prefork pool, ``multiprocessing``) starts
its own loop and session on first use and never touches its parent's.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import warnings
import weakref
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Iterable
from contextlib import AbstractContextManager, ExitStack
from functools import partial, update_wrapper
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import aiohttp

from ._exceptions import ConfigurationError, EventLoopError, SessionClosedError
from ._models import DispatchResult
from ._retry import RetryPolicy
from ._session import DispatchSession
from ._throttle import Limiter
from ._token_store import TokenStore
from .instrumentation import Hook

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal
    from typing_extensions import Unpack

    from ._batch import BatchOptions

__all__ = ["DispatchClient"]

P = ParamSpec("P")
T = TypeVar("T")

_INSTALL_HINT = 'DispatchClient needs the sync extra: pip install "dispatch-async[sync]"'


def _portal_starter() -> Callable[..., AbstractContextManager[BlockingPortal]]:
    try:
        from anyio.from_thread import start_blocking_portal
    except ImportError:
        raise ConfigurationError(_INSTALL_HINT) from None
    return start_blocking_portal


class _Loop:
    """One session on one background event loop, in this process; started on first use."""

    def __init__(self, make_session: Callable[[], DispatchSession]) -> None:
        self._start_portal = _portal_starter()
        self._make_session = make_session
        self.session = make_session()  # checks the arguments now, in the caller's thread
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._portal: BlockingPortal | None = None
        self._stack = ExitStack()
        self._closed = False
        _LOOPS.add(self)

    def open(self) -> tuple[BlockingPortal, DispatchSession]:
        """The portal into the running loop (started now if need be), and its session."""
        portal = self._portal
        if portal is not None and self._pid == os.getpid():
            return portal, self.session
        with self._lock:
            if self._pid != os.getpid():
                self._forget_parent()
            if self._closed:
                raise SessionClosedError("this DispatchClient is closed; create a new one")
            if self._portal is None:
                # One daemon thread: it never holds the interpreter's exit up.
                portal = self._stack.enter_context(self._start_portal(name="dispatch-async"))
                self._portal = portal
            return self._portal, self.session

    def portal_of(self, pid: int) -> BlockingPortal | None:
        """The running portal if this is still process *pid*, else None."""
        return self._portal if pid == self._pid == os.getpid() else None

    def close(self) -> None:
        with self._lock:
            if self._pid != os.getpid():
                self._forget_parent()
            if self._closed:
                return
            self._closed = True
            portal, self._portal = self._portal, None
            if portal is not None:
                try:
                    portal.call(self.session.close)
                finally:
                    self._stack.close()  # stops the loop and joins its thread

    def after_fork_in_child(self) -> None:
        # Another thread may have held the lock when the parent forked: in the child it
        # would never be released.
        self._lock = threading.Lock()

    def _forget_parent(self) -> None:
        from ._fork import left_by_parent

        if self._portal is not None:
            left_by_parent(self._portal, self._stack, self.session)
        self._pid = os.getpid()
        self._portal = None
        self._stack = ExitStack()
        self.session = self._make_session()

    def __del__(self) -> None:
        if getattr(self, "_portal", None) is not None and self._pid == os.getpid():
            warnings.warn(
                "unclosed DispatchClient: use 'with' or close() (or keep one for the "
                "life of the process: it closes at exit)",
                ResourceWarning,
                stacklevel=2,
            )


_LOOPS: weakref.WeakSet[_Loop] = weakref.WeakSet()


def _close_all() -> None:
    for loop in list(_LOOPS):
        loop.close()


def _after_fork_in_child() -> None:
    for loop in list(_LOOPS):
        loop.after_fork_in_child()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_after_fork_in_child)


def _blocking(
    method: Callable[Concatenate[DispatchSession, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[DispatchClient, P], T]:
    """The blocking twin of a session's coroutine method: same arguments, same result."""

    def call(self: DispatchClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        portal, session = self._open()
        result: T = portal.call(partial(method, session, *args, **kwargs))
        return result

    return update_wrapper(call, method)


def _iterating(
    method: Callable[Concatenate[DispatchSession, P], AsyncGenerator[DispatchResult, None]],
) -> Callable[Concatenate[DispatchClient, P], Generator[DispatchResult, None, None]]:
    """The plain-iterator twin of a session's ``stream_*`` method.

    The arguments are checked when it is called; the parts are read as it is iterated,
    with the session's read-ahead limits (the same async generator runs in the loop).
    """

    def stream(
        self: DispatchClient, /, *args: P.args, **kwargs: P.kwargs
    ) -> Generator[DispatchResult, None, None]:
        portal, session = self._open()
        parts = portal.call(partial(method, session, *args, **kwargs))
        return _iterate(self._loop, os.getpid(), parts)

    return update_wrapper(stream, method)


def _iterate(
    loop: _Loop, pid: int, parts: AsyncGenerator[DispatchResult, None]
) -> Generator[DispatchResult, None, None]:
    try:
        while True:
            portal = loop.portal_of(pid)
            if portal is None:
                raise EventLoopError(
                    "this stream was started in another process (or its client is closed)"
                )
            part = portal.call(anext, parts, None)
            if part is None:
                return
            yield part
    finally:
        portal = loop.portal_of(pid)
        if portal is not None:
            # From the loop's own thread (or as it stops) this cannot wait: asyncio then
            # closes the abandoned async generator itself.
            with contextlib.suppress(RuntimeError):
                portal.call(parts.aclose)


class DispatchClient:
    """The blocking client: `DispatchSession`'s calls for synchronous code.

    Make one per process and share it (between threads too), e.g. at module level in
    a Celery tasks module or a Django app; it starts on first use and closes at exit::

        client = DispatchClient.from_env()
        result = client.send_template(numbers, template_id="pix_reminder")

    The arguments are `DispatchSession`'s, except ``http_session`` (an aiohttp session
    belongs to one event loop, and the client's runs in its own thread). Callbacks
    (``on_progress``, ``before_send``, hooks) run in that thread. Needs the ``sync``
    extra (anyio).
    """

    def __init__(
        self,
        base_url: str,
        *,
        client_secret: str,
        account: str | None = None,
        timeout: float | aiohttp.ClientTimeout = 30.0,
        retry: RetryPolicy | None = None,
        requests_per_second: float | None = None,
        user_agent: str | None = None,
        token_store: TokenStore | None = None,
        rate_limiter: Limiter | None = None,
        hooks: Iterable[Hook] | None = None,
        **batch: Unpack[BatchOptions],
    ) -> None:
        make_session = partial(
            DispatchSession,
            base_url,
            client_secret=client_secret,
            account=account,
            timeout=timeout,
            retry=retry,
            requests_per_second=requests_per_second,
            user_agent=user_agent,
            token_store=token_store,
            rate_limiter=rate_limiter,
            hooks=None if hooks is None else tuple(hooks),  # made again after a fork
            **batch,
        )
        self._loop = _Loop(make_session)
        self._options: dict[str, Any] = {}
        self._view: tuple[DispatchSession, DispatchSession] | None = None

    @classmethod
    def from_env(cls, **kwargs: Any) -> DispatchClient:
        """A client configured as `DispatchSession.from_env` configures a session."""
        from ._environment import settings_from_env

        base_url, settings = settings_from_env(kwargs)
        return cls(base_url, **settings)

    def with_options(
        self,
        *,
        timeout: float | aiohttp.ClientTimeout | None = None,
        retry: RetryPolicy | None = None,
        **batch: Unpack[BatchOptions],
    ) -> DispatchClient:
        """This client with other options, sharing its loop, token, pool and rate limit.

        See `DispatchSession.with_options`; closing the view does nothing.
        """
        options = {**self._options, **batch}
        if timeout is not None:
            options["timeout"] = timeout
        if retry is not None:
            options["retry"] = retry
        self._loop.session.with_options(**options)  # a bad option fails here
        view = object.__new__(DispatchClient)
        view._loop, view._options, view._view = self._loop, options, None
        return view

    def __repr__(self) -> str:
        session = self._loop.session
        view = " view" if self._options else ""
        return (
            f"<DispatchClient{view} base_url={str(session.base_url)!r} account={session.account!r}>"
        )

    def _open(self) -> tuple[BlockingPortal, DispatchSession]:
        portal, session = self._loop.open()
        if not self._options:
            return portal, session
        view = self._view
        if view is None or view[0] is not session:  # first call, or a new process
            view = self._view = (session, session.with_options(**self._options))
        return portal, view[1]

    # -- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Close the session and stop its loop. Safe to call twice; a no-op on a view."""
        if not self._options:
            self._loop.close()

    def __enter__(self) -> DispatchClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the endpoints: the session's, blocking ------------------------------------

    send_template = _blocking(DispatchSession.send_template)
    send_basic = _blocking(DispatchSession.send_basic)
    send_single = _blocking(DispatchSession.send_single)
    send_webhook = _blocking(DispatchSession.send_webhook)
    stream_template = _iterating(DispatchSession.stream_template)
    stream_basic = _iterating(DispatchSession.stream_basic)
    stream_single = _iterating(DispatchSession.stream_single)
    stream_webhook = _iterating(DispatchSession.stream_webhook)
    list_templates = _blocking(DispatchSession.list_templates)
