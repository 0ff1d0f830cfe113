"""``DispatchClient``: the SDK for synchronous code (Celery, Django, threads, scripts).

A blocking call cannot start an event loop of its own each time (a new loop means a new
session, so a new token, per call) nor reuse a session across loops. The client runs
one `DispatchSession` on one event loop in a background thread (started and stopped by
anyio's ``BlockingPortal``), per process, and hands each call to it: every thread shares
one token and one connection pool. A forked child (Celery's prefork pool,
``multiprocessing``) starts its own loop and session on first use and never touches its
parent's.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
import warnings
import weakref
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Iterable
from contextlib import AbstractContextManager, ExitStack
from functools import partial, update_wrapper
from ssl import SSLContext
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar

import aiohttp
from yarl import URL

from ._arguments import check_arguments
from ._auth import Secret, TokenRequest
from ._batch_settings import check_options
from ._exceptions import ConfigurationError, EventLoopError, SessionClosedError
from ._outcome import DispatchResult
from ._retry import RetryPolicy
from ._session import DispatchSession
from ._throttle import Limiter
from ._token_store import TokenStore
from .instrumentation import Hook

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal
    from typing_extensions import Unpack

    from ._batch_settings import BatchOptions

__all__ = ["DispatchClient"]

P = ParamSpec("P")
T = TypeVar("T")

_OWN_THREAD = (
    "a DispatchClient cannot wait for its own event loop (this is a hook or callback "
    "running on it): await the session's calls there instead"
)
_IN_A_LOOP = (
    "a DispatchClient call blocks its thread until it is done, and this thread runs an "
    "event loop, which would stand still meanwhile: in async code use DispatchSession "
    "and await its calls (or run this call in a worker thread: asyncio.to_thread)"
)
_INSTALL_HINT = 'DispatchClient needs the sync extra: pip install "dispatch-async[sync]"'


def _portal_starter() -> Callable[..., AbstractContextManager[BlockingPortal]]:
    try:
        from anyio.from_thread import start_blocking_portal
    except ImportError:
        raise ConfigurationError(_INSTALL_HINT) from None
    return start_blocking_portal


class _Loop:
    """One session on one background event loop, in this process; started on first use.

    anyio's portal starts and stops the loop's thread; each call crosses to it with
    ``asyncio.run_coroutine_threadsafe``, one round trip where the portal's own ``call``
    makes two (see benchmarks/blocking.py).
    """

    def __init__(self, make_session: Callable[[], DispatchSession]) -> None:
        self._start_portal = _portal_starter()
        self._make_session = make_session
        self.session = make_session()  # checks the arguments now, in the caller's thread
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self._stack = ExitStack()
        self._closed = False
        self._calls: set[asyncio.Task[Any]] = set()  # the calls under way, on the loop
        self.streams: weakref.WeakSet[AsyncGenerator[DispatchResult, None]] = weakref.WeakSet()
        _LOOPS.add(self)

    def open(self) -> DispatchSession:
        """The session, its loop started now if need be."""
        if self._loop is None or self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._forget_parent()
                if self._closed:
                    raise SessionClosedError("this DispatchClient is closed; create a new one")
                if self._loop is None:
                    # One daemon thread: it never holds the interpreter's exit up.
                    portal = self._stack.enter_context(self._start_portal(name="dispatch-async"))
                    self._thread = portal.call(threading.get_ident)
                    self._loop = portal.call(asyncio.get_running_loop)
        return self.session

    def run(
        self, coroutine: Coroutine[Any, Any, T], pid: int | None = None, *, closing: bool = False
    ) -> T:
        """Run *coroutine* on the loop and wait; an interrupted caller (Ctrl-C) cancels it.

        With *pid* (a stream's), refuse to go on in any other process. Refused in a
        thread that runs an event loop, unless *closing* (a stream's quick close, which
        the garbage collector may start anywhere).
        """
        loop = self._loop
        tracked = self._tracked(coroutine)
        try:
            if pid is not None and not pid == self._pid == os.getpid():
                raise EventLoopError("this stream was started in another process")
            if loop is None:
                raise SessionClosedError("this DispatchClient is closed; create a new one")
            if threading.get_ident() == self._thread:
                raise EventLoopError(_OWN_THREAD)  # waiting here would wait forever
            if not closing and _loop_running():
                raise EventLoopError(_IN_A_LOOP)
            future = asyncio.run_coroutine_threadsafe(tracked, loop)
        except BaseException:
            tracked.close()  # never started: no "never awaited" warning
            coroutine.close()
            raise
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._closed:  # another thread closed the client: its loop cancelled the call
                raise SessionClosedError("this DispatchClient was closed during the call") from None
            raise
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        if threading.get_ident() == self._thread:
            raise EventLoopError(_OWN_THREAD)
        with self._lock:
            if self._pid != os.getpid():
                self._forget_parent()
            if self._closed:
                return
            self._closed = True
            if self._loop is not None:
                try:
                    self.run(self._closing())
                finally:
                    self._loop = self._thread = None
                    self._stack.close()  # stops the loop and joins its thread

    async def _tracked(self, coroutine: Coroutine[Any, Any, T]) -> T:
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        try:
            return await coroutine
        finally:
            self._calls.discard(task)

    async def _closing(self) -> None:
        # Streams left half-read are closed here, each from its outermost generator: the
        # loop's own shutdown would close every nested generator at once, and report each
        # inner one "already running".
        for parts in list(self.streams):
            if getattr(parts, "ag_await", None) is None:  # not mid-read
                await parts.aclose()
        await self.session.close()
        # Closing stopped every call under way in other threads (a read mid-stream too):
        # each ends now with its result, or its error carrying one. Cancelled with the
        # loop instead, a send would lose its recipients.
        while calls := self._calls - {asyncio.current_task()}:
            await asyncio.wait(calls)

    def after_fork_in_child(self) -> None:
        # Another thread may have held the lock when the parent forked: in the child it
        # would never be released.
        self._lock = threading.Lock()

    def _forget_parent(self) -> None:
        from ._fork import left_by_parent

        if self._loop is not None:
            left_by_parent(self._loop, self._stack, self.session)
        self._pid = os.getpid()
        self._loop = self._thread = None
        self._stack = ExitStack()
        self.streams = weakref.WeakSet()  # the parent's run on its loop, never on ours
        self.session = self._make_session()

    def __del__(self) -> None:
        if getattr(self, "_loop", None) is not None and self._pid == os.getpid():
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
        return self._loop.run(method(self._session(), *args, **kwargs))

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
        session = self._session()
        parts = self._loop.run(_made(partial(method, session, *args, **kwargs)))
        self._loop.streams.add(parts)
        return _iterate(self._loop, os.getpid(), parts)

    return update_wrapper(stream, method)


def _iterate(
    loop: _Loop, pid: int, parts: AsyncGenerator[DispatchResult, None]
) -> Generator[DispatchResult, None, None]:
    reading: list[asyncio.Task[Any]] = []  # the last read's task on the loop
    try:
        while (part := loop.run(_next(parts, reading), pid)) is not None:
            yield part
    finally:
        # In another process, after the client closed, or from the loop's own thread (as
        # the garbage collector may): asyncio closes an abandoned generator itself.
        with contextlib.suppress(EventLoopError, SessionClosedError):
            loop.run(_closed(parts, reading), pid, closing=True)


def _loop_running() -> bool:
    """Whether this thread runs an event loop (that a blocking call would stall)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


# run_coroutine_threadsafe takes coroutines only: these wrap what the streams need.
async def _made(make: Callable[[], T]) -> T:
    return make()  # a stream is made on the loop: it opens the session there


async def _next(
    parts: AsyncGenerator[DispatchResult, None], reading: list[asyncio.Task[Any]]
) -> DispatchResult | None:
    reading[:] = filter(None, [asyncio.current_task()])
    return await anext(parts, None)


async def _closed(
    parts: AsyncGenerator[DispatchResult, None], reading: list[asyncio.Task[Any]]
) -> None:
    # A read that Ctrl-C interrupted is still being cancelled: until it has unwound, the
    # generator is running and cannot be closed.
    if reading:
        await asyncio.wait(reading)
    await parts.aclose()


class DispatchClient:
    """The blocking client: `DispatchSession`'s calls for synchronous code.

    Make one per process and share it (between threads too), e.g. at module level in
    a Celery tasks module or a Django app; it starts on first use and closes at exit:

        client = DispatchClient.from_env()
        result = client.send_template(numbers, template_id="pix_reminder")

    The arguments are `DispatchSession`'s, except ``http_session`` (an aiohttp session
    belongs to one event loop, and the client's runs in its own thread); ``proxy``,
    ``trust_env`` and ``ssl`` are as there (docs/guides/networks.md). Callbacks
    (``on_progress``, ``on_chunk``, ``before_send``, hooks) run in that thread. Needs the ``sync``
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
        requests_per_second: float | Literal["auto"] | None = None,
        max_requests_per_second: float | None = None,
        user_agent: str | None = None,
        token_store: TokenStore | None = None,
        rate_limiter: Limiter | None = None,
        hooks: Iterable[Hook] | None = None,
        token_request: TokenRequest = "auto",  # noqa: S107 - an encoding, not a secret
        proxy: str | URL | None = None,
        trust_env: bool = True,
        ssl: SSLContext | None = None,
        **batch: Unpack[BatchOptions],
    ) -> None:
        check_arguments({k: v for k, v in locals().items() if k not in ("self", "batch")})
        check_options(batch, DispatchClient.__init__)
        # The secret is kept masked: a traceback that shows locals reprs what the client holds.
        secret = Secret(client_secret)
        options = partial(
            DispatchSession,
            base_url,
            account=account,
            timeout=timeout,
            retry=retry,
            requests_per_second=requests_per_second,
            max_requests_per_second=max_requests_per_second,
            user_agent=user_agent,
            token_store=token_store,
            rate_limiter=rate_limiter,
            hooks=None if hooks is None else tuple(hooks),  # made again after a fork
            token_request=token_request,
            proxy=proxy,
            trust_env=trust_env,
            ssl=ssl,
            **batch,
        )

        def make_session() -> DispatchSession:
            return options(client_secret=secret.reveal())

        self._loop = _Loop(make_session)
        self._options: dict[str, Any] = {}
        self._view: tuple[DispatchSession, DispatchSession] | None = None
        self._owns = True  # False in a view (even one without options): the client owns it all

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
        view._owns = False
        return view

    def __repr__(self) -> str:
        session = self._loop.session
        view = "" if self._owns else " view"
        return (
            f"<DispatchClient{view} base_url={str(session.base_url)!r} account={session.account!r}>"
        )

    def _session(self) -> DispatchSession:
        session = self._loop.open()
        if not self._options:
            return session
        view = self._view
        if view is None or view[0] is not session:  # first call, or a new process
            view = self._view = (session, session.with_options(**self._options))
        return view[1]

    # -- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Close the session and stop its loop. Safe to call twice; a no-op on a view."""
        if self._owns:
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
    check_credentials = _blocking(DispatchSession.check_credentials)
