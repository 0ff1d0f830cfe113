"""The simulator itself: its aiohttp app and lifecycle, scripting, and what it records.

What it simulates lives a floor down: the token endpoint in `_token_endpoint`, the
dispatch endpoints in `_dispatch_endpoints`, the HTTP answers both give in `_replies`.
"""

from __future__ import annotations

import asyncio
import enum
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Literal, Self

import attrs
import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from ._callbacks import CallbackPlan, CallbackSender
from ._contract import ENDPOINTS
from ._dispatch_endpoints import API_PREFIX, DispatchEndpoints, endpoint_name, listed, template_vars
from ._faults import Fault, FaultSchedule
from ._ids import IdFactory
from ._rate import AccountRateLimit
from ._recorder import (
    DEFAULT_RECORDED_BODY_BYTES,
    DEFAULT_RECORDED_REQUESTS,
    RecordedRequest,
    Recorder,
)
from ._replies import Dropped, json_answer
from ._stats import ServerStats
from ._token_endpoint import Unset
from ._tokens import IssuedTokens

__all__ = ["DEFAULT_TEMPLATES", "FakeDispatchServer"]

#: What ``GET /api/v3/templates`` lists unless told otherwise. The spec does not show this
#: response; the shape is the simulator's choice: ``{"templates": [<these objects>]}``.
DEFAULT_TEMPLATES: Final[tuple[Mapping[str, str], ...]] = (
    {"id": "pix_reminder", "name": "PIX payment reminder", "channel": "rcs"},
    {"id": "order_shipped", "name": "Order shipped", "channel": "rcs"},
    {"id": "otp_code", "name": "One-time code", "channel": "sms"},
)

# Handlers are woken by close() before aiohttp's shutdown, so this only bounds handlers
# stuck somewhere the simulator does not control (e.g. a client trickling a body).
_SHUTDOWN_TIMEOUT: Final = 0.25
_RELEVANT_HEADERS: Final = ("User-Agent", "X-Auth-Type", "Accept", "Content-Type")
_OWN_PREFIX: Final = "/_"  # the simulator's own paths, not the service's: never recorded


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class FakeDispatchServer(DispatchEndpoints):
    """An in-process dispatch service on 127.0.0.1, scriptable with faults.

    Use it as ``async with FakeDispatchServer() as server:`` and point a client at
    ``server.url``. Everything it saw is counted in ``server.stats`` and the latest
    requests themselves are in ``server.requests``; faults are queued with `script`,
    `script_for` and `script_token`.

    The API documentation shows no error answers, so these are the simulator's, except the 403 that
    integrations of the real service report. With ``allowed_ips``, a caller from another
    address gets 403 ``{"message": "IP address is not allowed: <ip>"}`` on the token
    endpoint and under ``/api/v3``. Token endpoint: 400 ``{"error":
    "unsupported_grant_type"}`` (also for a body in an encoding ``token_body`` does not
    read), 401 ``{"error": "invalid_client"}``. Under
    ``/api/v3``, checked in this order: 401 ``{"error": "invalid_token"}`` (missing,
    unknown, expired or revoked token); 400 ``invalid_auth_type`` (X-Auth-Type other than
    JWT); 415 (body not declared JSON); 400 ``invalid_json``, ``invalid_body``,
    ``unknown_field``, ``missing_field`` or ``invalid_field``, as ``{"error", "message",
    "field"}``; with ``templates`` as a mapping, ``unknown_template`` or ``missing_var``
    too. A refused request is neither acted on nor consumes a fault.

    Args:
        client_secret: the secret the token endpoint accepts.
        token_lifetime: seconds a token stays valid on the server's monotonic clock;
            settable later, applying to tokens issued afterwards.
        expires_in: the raw JSON value to return as ``expires_in`` instead of the
            lifetime as a string (e.g. ``3600``, ``"abc"``); None omits the field.
        host: the address to listen on; keep the default outside of containers.
        port: 0 picks a free port.
        latency: seconds added before every dispatch answer.
        fault_rates: status code to probability, random status faults for soak runs;
            they are never acted on.
        seed: seeds those random draws.
        random_retry_after: the ``Retry-After`` sent with random 429s.
        fast_ids: number the message ids instead of drawing them (benchmarks).
        max_body_bytes: largest request body accepted (413 beyond).
        templates: what the templates listing returns (a sequence of objects); or, as a
            mapping of template id to the vars it needs (``{"pix_reminder": ["pixCode"]}``),
            the account's only templates: a dispatch naming another ``template_id``, or
            with a recipient missing one of its vars, gets 400 ``unknown_template`` or
            ``missing_var`` (the simulator's choice: the API documentation shows
            neither), and the listing is derived from it. Not enforced by default: any
            template, any vars.
        jwt_tokens: issue signed JWTs with ``iat`` and ``exp`` claims (as the real service
            is inferred to, from its ``X-Auth-Type: JWT``) instead of opaque tokens.
        token_body: what the token endpoint reads: ``"form"`` (the API documentation's
            x-www-form-urlencoded body), ``"json"`` (a JSON object, whatever the declared
            type, as the vendor's example sends it), or ``"any"``.
        allowed_ips: the only caller addresses served (an account's IP allow-list);
            None serves every caller.
        session_ids: give each valid message a ``session_id``, as the real service
            does: null for basic and single, a conversation id for webhook and template.
        rate_limit: dispatch requests a second allowed per account (a token bucket with
            a burst of one second's worth); beyond it, 429 with ``Retry-After`` in
            seconds (decimals) and nothing acted on. None, the default, has no limit.
            Settable while serving.
        recorded_requests: how many of the latest requests ``requests`` keeps (0: none).
        recorded_body_bytes: bodies larger than this are recorded by their size only.
        callbacks: send delivery callbacks (`CallbackPlan`) to each request's
            ``callback`` URL (else its ``webhook`` URL) for the messages the service
            acted on, with the ids of its answer; ``server.callbacks`` is then the
            `CallbackSender` (its ``stats``, ``await settled()``). None sends none.

    Beyond the service's paths the simulator answers ``GET /_stats`` (its counters, as
    JSON), ``GET /_requests`` (``requests``, as JSON) and ``PUT /_rate_limit``
    (``{"rate": R}`` or ``{"rate": null}``): they are the simulator's, for tests and
    benchmarks of another process, not part of the service.
    """

    def __init__(
        self,
        *,
        client_secret: str = "test-secret",  # noqa: S107 - a fake's well-known default
        token_lifetime: float = 3600.0,
        expires_in: object = Unset.UNSET,
        host: str = "127.0.0.1",
        port: int = 0,
        latency: float = 0.0,
        fault_rates: Mapping[int, float] | None = None,
        seed: int | None = None,
        random_retry_after: str = "0",
        fast_ids: bool = False,
        max_body_bytes: int = 64 * 1024 * 1024,
        templates: Sequence[Mapping[str, str]] | Mapping[str, Sequence[str]] = DEFAULT_TEMPLATES,
        rate_limit: float | None = None,
        jwt_tokens: bool = False,
        token_body: Literal["form", "json", "any"] = "form",  # noqa: S107 - not a secret
        allowed_ips: Collection[str] | None = None,
        session_ids: bool = True,
        recorded_requests: int = DEFAULT_RECORDED_REQUESTS,
        recorded_body_bytes: int = DEFAULT_RECORDED_BODY_BYTES,
        callbacks: CallbackPlan | None = None,
    ) -> None:
        if token_body not in ("form", "json", "any"):
            raise ValueError(f"token_body must be form, json or any, not {token_body!r}")
        self.client_secret = client_secret
        self.jwt_tokens = jwt_tokens
        self.token_body = token_body
        self.allowed_ips = None if allowed_ips is None else frozenset(allowed_ips)
        self.session_ids = session_ids
        self.token_lifetime = token_lifetime
        self.expires_in = expires_in
        self.latency = latency
        #: The templates a dispatch may name, with the vars each needs; None: any.
        self.template_vars: dict[str, tuple[str, ...]] | None = None
        self.templates: list[Mapping[str, object]] = []
        if isinstance(templates, Mapping):
            self.template_vars = template_vars(templates)
            self.templates = [listed(name, vars_) for name, vars_ in self.template_vars.items()]
        else:
            self.templates = list(templates)
        self.stats = ServerStats()
        self._host = host
        self._port = port
        self._max_body_bytes = max_body_bytes
        self._faults = FaultSchedule(fault_rates, seed=seed, retry_after=random_retry_after)
        self._ids = IdFactory(fast=fast_ids)
        self._limit = AccountRateLimit(rate_limit)
        self._tokens = IssuedTokens()
        self._recorder = Recorder(recorded_requests, recorded_body_bytes)
        self._state = _State.UNOPENED
        self._runner: web.AppRunner | None = None
        self._address: tuple[str, int] | None = None
        self._closing = asyncio.Event()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._in_flight = 0
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []
        self.callbacks = None if callbacks is None else CallbackSender(callbacks)

    # Lifecycle

    async def start(self) -> None:
        """Bind and start serving. A server starts once; make a new one to restart."""
        if self._state is not _State.UNOPENED:
            raise RuntimeError(f"cannot start a FakeDispatchServer that is {self._state.value}")
        self._state = _State.OPEN
        runner = web.AppRunner(
            self._make_app(),
            handle_signals=False,
            access_log=None,
            shutdown_timeout=_SHUTDOWN_TIMEOUT,
            # A client that gives up cancels its handler, so a hang ends with the client.
            handler_cancellation=True,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port).start()
        except BaseException:
            self._state = _State.CLOSED
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self._address = (host, port)
        if self.callbacks is not None:
            await self.callbacks.start()

    async def close(self) -> None:
        """Stop serving; hanging or delayed handlers drop their connections. Idempotent."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        self._closing.set()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self.callbacks is not None:
            await self.callbacks.close()
        # Handlers whose connection is already gone are no longer tracked by aiohttp:
        # make sure none outlives the server.
        leftovers = [task for task in self._handlers if not task.done()]
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.wait(leftovers, timeout=1.0)
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(RuntimeError("the server closed"))

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        if getattr(self, "_state", None) is _State.OPEN:
            _warn(f"unclosed {self!r}", ResourceWarning, source=self, stacklevel=1)

    def __repr__(self) -> str:
        where = self.url if self._address else self._state.value
        return f"<FakeDispatchServer {where}>"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, without a trailing slash."""
        if self._address is None:
            raise RuntimeError("the server is not started")
        host, port = self._address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def port(self) -> int:
        """The port actually bound."""
        if self._address is None:
            raise RuntimeError("the server is not started")
        return self._address[1]

    @property
    def in_flight(self) -> int:
        """``/api/v3`` requests being handled right now."""
        return self._in_flight

    # Scripting

    def script(self, *faults: Fault, path: str | None = None) -> None:
        """Queue faults for the next dispatch requests, one each, in order.

        Args:
            faults: consumed one per request by requests that pass authentication and
                validation (a refused request never consumes a fault).
            path: only requests to this endpoint ("basic" or "/api/v3/basic");
                None for any dispatch endpoint.
        """
        self._faults.add(faults, path=None if path is None else endpoint_name(path))

    def script_for(self, number: str, *faults: Fault) -> None:
        """Queue faults for the next requests whose messages contain ``number``.

        This picks out one chunk of a concurrent send deterministically.
        """
        self._faults.add_for_number(number, faults)

    def script_token(self, *faults: Fault) -> None:
        """Queue faults for the next token requests (status, delay, hang, drop, ...)."""
        self._faults.add_for_token(faults)

    @property
    def pending_faults(self) -> int:
        """Scripted faults not yet consumed; 0 once a test's script has played out."""
        return self._faults.pending

    def clear_faults(self) -> None:
        """Drop every scripted fault not yet consumed."""
        self._faults.clear()

    @property
    def rate_limit(self) -> float | None:
        """Dispatch requests a second allowed per account; None for no limit."""
        return self._limit.rate

    @rate_limit.setter
    def rate_limit(self, rate: float | None) -> None:
        self._limit.rate = rate

    # Tokens and stats

    def issue_token(self) -> str:
        """A valid token without going through ``/oauth/token`` (not counted in stats)."""
        return self._tokens.issue(self.token_lifetime, jwt=self.jwt_tokens)

    def expire_tokens(self) -> None:
        """Expire every token issued so far, as if their lifetime had passed."""
        self._tokens.expire_all()

    def reset_stats(self) -> None:
        """Zero the counters in place (references to ``server.stats`` stay valid)."""
        fresh = ServerStats(max_concurrent=self._in_flight)
        for field in attrs.fields(ServerStats):
            setattr(self.stats, field.name, getattr(fresh, field.name))

    @property
    def requests(self) -> list[RecordedRequest]:
        """The latest requests received, oldest first, credentials removed (a copy).

        Every request to the service's paths is kept as it arrived, before it is
        authenticated, refused or faulted, so a test can check what a client sent.
        """
        return self._recorder.requests

    def clear_requests(self) -> None:
        """Forget the requests recorded so far."""
        self._recorder.clear()

    # A bound by default, because a condition that never comes true must fail the test,
    # not hang it.
    async def wait_until(
        self,
        condition: Callable[[], bool],
        *,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> None:
        """Wait until ``condition()`` holds, re-checked whenever a request changes state.

        Lets a test synchronise on what the server saw (``lambda: server.in_flight == 2``)
        instead of sleeping. Raises TimeoutError after ``timeout`` seconds.
        """
        if condition():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (condition, future)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await future
        finally:
            self._waiters.remove(entry)

    def _notify(self) -> None:
        for condition, future in self._waiters:
            if not future.done() and condition():
                future.set_result(None)

    # The app

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=self._max_body_bytes, middlewares=[self._observe])
        app.router.add_post("/oauth/token", self._token)
        app.router.add_get("/api/v3/templates", self._list_templates)
        app.router.add_post("/api/v3/{endpoint:" + "|".join(ENDPOINTS) + "}", self._dispatch)
        app.router.add_get("/_stats", self._stats)
        app.router.add_get("/_requests", self._requests)
        app.router.add_put("/_rate_limit", self._set_rate_limit)
        return app

    @web.middleware
    async def _observe(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Count every request and answer, and own every handler task."""
        stats = self.stats
        api = request.path.startswith(API_PREFIX)
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        if api:
            stats.requests += 1
            self._in_flight += 1
            stats.max_concurrent = max(stats.max_concurrent, self._in_flight)
            headers = request.headers
            stats.last_headers = {k: headers[k] for k in _RELEVANT_HEADERS if k in headers}
            self._notify()
        try:
            try:
                if not request.path.startswith(_OWN_PREFIX):
                    body = None
                    try:
                        body = await request.read()
                    finally:  # a body refused as too large (413) is recorded without it
                        self._recorder.record(request.method, request.path, request.headers, body)
                response = await handler(request)
            except web.HTTPException as exc:
                self._count_status(exc.status, api=api)
                raise
            except Dropped:
                stats.dropped += 1
                # Never written: aiohttp finds the transport closing and moves on quietly.
                return web.Response()
            self._count_status(response.status, api=api)
            return response
        finally:
            if api:
                self._in_flight -= 1
            if task is not None:
                self._handlers.discard(task)
            self._notify()

    def _count_status(self, status: int, *, api: bool) -> None:
        self.stats.status_counts[status] += 1
        if api and status == 401:
            self.stats.unauthorized += 1

    async def _stats(self, request: web.Request) -> web.StreamResponse:
        return json_answer(200, self.stats.as_json())

    async def _requests(self, request: web.Request) -> web.StreamResponse:
        return json_answer(200, [recorded.as_json() for recorded in self.requests])

    async def _set_rate_limit(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
            rate = body["rate"]
            self.rate_limit = None if rate is None else float(rate)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return json_answer(400, {"error": "invalid_body", "message": str(exc)})
        return json_answer(200, {"rate": self.rate_limit})
