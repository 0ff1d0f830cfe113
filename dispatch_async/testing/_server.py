"""The simulator itself: an aiohttp app that follows the dispatch spec, and its lifecycle."""

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
from ._contract import ENDPOINTS, FieldError, check_template, dispatch_answer, parse_dispatch
from ._faults import Fault, FaultKind, FaultSchedule
from ._ids import IdFactory
from ._rate import AccountRateLimit
from ._recorder import (
    DEFAULT_RECORDED_BODY_BYTES,
    DEFAULT_RECORDED_REQUESTS,
    RecordedRequest,
    Recorder,
)
from ._stats import ServerStats
from ._tokens import IssuedTokens, TokenState

__all__ = ["DEFAULT_TEMPLATES", "FakeDispatchServer"]

#: What ``GET /api/v3/templates`` lists unless told otherwise. The spec does not show this
#: response; the shape is the simulator's choice: ``{"templates": [<these objects>]}``.
DEFAULT_TEMPLATES: Final[tuple[Mapping[str, str], ...]] = (
    {"id": "pix_reminder", "name": "PIX payment reminder", "channel": "rcs"},
    {"id": "order_shipped", "name": "Order shipped", "channel": "rcs"},
    {"id": "otp_code", "name": "One-time code", "channel": "sms"},
)

_API_PREFIX: Final = "/api/v3/"
_JSON: Final = "application/json"
# Handlers are woken by close() before aiohttp's shutdown, so this only bounds handlers
# stuck somewhere the simulator does not control (e.g. a client trickling a body).
_SHUTDOWN_TIMEOUT: Final = 0.25
_RELEVANT_HEADERS: Final = ("User-Agent", "X-Auth-Type", "Accept", "Content-Type")
#: The endpoints whose messages open a conversational session (a session_id).
_CONVERSATIONAL: Final = frozenset({"webhook", "template"})
_OWN_PREFIX: Final = "/_"  # the simulator's own paths, not the service's: never recorded


class _Unset(enum.Enum):
    UNSET = enum.auto()


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class _Dropped(Exception):
    """A handler closed its connection on purpose: there is no answer to send."""


class FakeDispatchServer:
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
        expires_in: object = _Unset.UNSET,
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
            self.template_vars = _template_vars(templates)
            self.templates = [_listed(name, vars_) for name, vars_ in self.template_vars.items()]
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
        self._faults.add(faults, path=None if path is None else _endpoint_name(path))

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
        api = request.path.startswith(_API_PREFIX)
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
            except _Dropped:
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

    async def _token(self, request: web.Request) -> web.StreamResponse:
        self.stats.token_calls += 1
        refused = self._refuse_caller(request)
        if refused is not None:
            return refused
        form = await self._token_fields(request)
        fault = self._faults.for_token()
        if fault is not None:
            self.stats.faults_injected += 1
            early = await self._token_fault(request, fault)
            if early is not None:
                return early
        if form.get("grant_type") != "client_credentials":
            return _json(400, {"error": "unsupported_grant_type"})
        if form.get("client_secret") != self.client_secret:
            return _json(401, {"error": "invalid_client"})
        body: dict[str, object] = {
            "access_token": self._tokens.issue(self.token_lifetime, jwt=self.jwt_tokens),
            "token_type": "Bearer",
        }
        self.stats.tokens_issued += 1
        if self.expires_in is _Unset.UNSET:
            body["expires_in"] = _seconds_text(self.token_lifetime)
        elif self.expires_in is not None:
            body["expires_in"] = self.expires_in
        return _json(200, body, headers={"Cache-Control": "no-store"})

    async def _token_fields(self, request: web.Request) -> Mapping[str, object]:
        """The token request's fields, read as ``token_body`` says; empty if unreadable."""
        raw = await request.read()
        reads = self.token_body
        if reads == "form" or (reads == "any" and not raw.lstrip().startswith(b"{")):
            return await request.post()
        try:
            fields = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {}
        return fields if isinstance(fields, dict) else {}

    def _refuse_caller(self, request: web.Request) -> web.Response | None:
        """The 403 for a caller outside ``allowed_ips``, else None."""
        allowed = self.allowed_ips
        if allowed is None or request.remote in allowed:
            return None
        self.stats.forbidden += 1
        return _json(403, {"message": f"IP address is not allowed: {request.remote}"})

    async def _token_fault(self, request: web.Request, fault: Fault) -> web.Response | None:
        match fault.kind:
            case FaultKind.STATUS:
                return _status_response(fault)
            case FaultKind.DELAY:
                await self._pause(request, fault.seconds)
                return None
            case FaultKind.NOT_JSON:
                return _raw(200, fault.body or b"", fault.content_type)
            case FaultKind.WRONG_SHAPE:
                if fault.body is not None:
                    return _raw(200, fault.body, _JSON)
                shape = {"expires_in": _seconds_text(self.token_lifetime), "token_type": "Bearer"}
                return _json(200, shape)
        # HANG, DROP and DROP_BEFORE (FaultSchedule lets no other kind through): no answer.
        if fault.kind is FaultKind.HANG:
            await self._pause(request, None)
        raise _drop(request)

    def _authenticate(self, request: web.Request) -> str | web.Response:
        """The presented token if usable, else the answer refusing the request."""
        refused = self._refuse_caller(request)
        if refused is not None:
            return refused
        token = _bearer_token(request.headers.get("Authorization"))
        state = self._tokens.check(token)
        if state is TokenState.VALID:
            assert token is not None
            auth_type = request.headers.get("X-Auth-Type")
            if auth_type is not None and auth_type != "JWT":
                message = f"X-Auth-Type must be JWT, got {auth_type!r}"
                return _json(400, {"error": "invalid_auth_type", "message": message})
            return token
        stats = self.stats
        match state:
            case TokenState.MISSING:
                stats.missing_token += 1
            case TokenState.UNKNOWN:
                stats.unknown_token_uses += 1
            case TokenState.EXPIRED:
                stats.expired_token_uses += 1
            case TokenState.REVOKED:
                stats.revoked_token_uses += 1
        return _invalid_token()

    async def _list_templates(self, request: web.Request) -> web.StreamResponse:
        auth = self._authenticate(request)
        if isinstance(auth, web.Response):
            return auth
        accept = request.headers.get("Accept")
        if accept is not None and not _accepts_json(accept):
            return _json(406, {"error": "not_acceptable", "message": "only application/json"})
        return _json(200, {"templates": [dict(t) for t in self.templates]})

    async def _stats(self, request: web.Request) -> web.StreamResponse:
        return _json(200, self.stats.as_json())

    async def _requests(self, request: web.Request) -> web.StreamResponse:
        return _json(200, [recorded.as_json() for recorded in self.requests])

    async def _set_rate_limit(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
            rate = body["rate"]
            self.rate_limit = None if rate is None else float(rate)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return _json(400, {"error": "invalid_body", "message": str(exc)})
        return _json(200, {"rate": self.rate_limit})

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        response = await self._answer_dispatch(request, request.match_info["endpoint"])
        if self.latency > 0:
            await self._pause(request, self.latency)
        return response

    async def _answer_dispatch(self, request: web.Request, endpoint: str) -> web.Response:
        auth = self._authenticate(request)
        if isinstance(auth, web.Response):
            return auth
        if request.content_type != _JSON:
            message = f"Content-Type must be {_JSON}, got {request.content_type}"
            return _json(415, {"error": "unsupported_media_type", "message": message})
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _json(400, {"error": "invalid_json", "message": str(exc)})
        try:
            numbers = parse_dispatch(endpoint, body)
            if self.template_vars is not None:
                check_template(body, self.template_vars)
        except FieldError as exc:
            return _json(400, exc.to_json())
        wait = self._limit.take(body["account"])
        if wait is not None:
            self.stats.rate_limited += 1
            return _json(
                429, {"error": "rate_limited"}, headers={"Retry-After": f"{max(wait, 0.001):.3f}"}
            )
        fault = self._faults.for_dispatch(endpoint, numbers)
        if fault is None:
            return _json(200, self._act(endpoint, numbers, body))
        self.stats.faults_injected += 1
        return await self._apply(fault, request, endpoint, numbers, auth, body)

    async def _apply(
        self,
        fault: Fault,
        request: web.Request,
        endpoint: str,
        numbers: list[str],
        token: str,
        body: dict[str, Any],
    ) -> web.Response:
        # What the service made when it acted: later answers show the same ids.
        acted = self._act(endpoint, numbers, body) if fault.acted else None
        match fault.kind:
            case FaultKind.STATUS:
                return _status_response(fault)
            case FaultKind.REVOKE_TOKEN:
                self._tokens.revoke(token)
                return _invalid_token()
            case FaultKind.DROP | FaultKind.DROP_BEFORE:
                raise _drop(request)
            case FaultKind.HANG:
                await self._pause(request, None)
            case FaultKind.DELAY:
                await self._pause(request, fault.seconds)
            case FaultKind.NOT_JSON:
                return _raw(200, fault.body or b"", fault.content_type)
            case FaultKind.WRONG_SHAPE:
                if fault.body is not None:
                    return _raw(200, fault.body, _JSON)
                return _json(200, self._answer(endpoint, numbers, drop_ids=True))
            case FaultKind.OMIT:
                kept = numbers[: max(0, len(numbers) - fault.count)]
                return _json(200, self._answer(endpoint, kept, like=acted))
            case FaultKind.DIGITS_ONLY:
                return _json(200, self._answer(endpoint, numbers, like=acted, digits_only=True))
        return _json(200, acted if acted is not None else self._answer(endpoint, numbers))

    def _answer(
        self,
        endpoint: str,
        numbers: list[str],
        like: dict[str, Any] | None = None,
        **distortions: bool,
    ) -> dict[str, Any]:
        """The answer for *numbers*: fresh ids, or those of *like* (an earlier answer)."""
        take_ids: Callable[[int], list[str]] = self._ids.take
        sessions: Callable[[int], Sequence[str | None]] | None = None
        if self.session_ids:
            sessions = self._ids.take if endpoint in _CONVERSATIONAL else _no_sessions
        if like is not None:
            made = like["validMessages"]
            take_ids = lambda n: [m["id"] for m in made[:n]]  # noqa: E731
            if sessions is not None:
                sessions = lambda n: [m["session_id"] for m in made[:n]]  # noqa: E731
        return dispatch_answer(numbers, take_ids, take_sessions=sessions, **distortions)

    def _act(self, endpoint: str, numbers: list[str], body: dict[str, Any]) -> dict[str, Any]:
        """Act on a request: count it, make its answer, send its callbacks; the answer."""
        answer = self._answer(endpoint, numbers)
        if self.callbacks is not None:
            self.callbacks.acted(endpoint, body, answer)
        stats = self.stats
        stats.dispatch_calls += 1
        stats.calls_by_path[endpoint] += 1
        # Counter.update on a list counts in C: cheap even for a million recipients.
        stats.received.update(numbers)
        stats.recipients_received += len(numbers)
        self._notify()
        return answer

    async def _pause(self, request: web.Request, seconds: float | None) -> None:
        """Wait ``seconds`` (None: forever), dropping the connection if the server closes."""
        if seconds is None:
            await self._closing.wait()
        else:
            try:
                async with asyncio.timeout(seconds):
                    await self._closing.wait()
            except TimeoutError:
                return
        raise _drop(request)


def _template_vars(templates: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    checked = {}
    for name, needs in templates.items():
        if not isinstance(name, str) or isinstance(needs, str | bytes):
            raise TypeError(
                "templates as a mapping is {template_id: [var, ...]}, e.g. "
                f'{{"pix_reminder": ["pixCode"]}}; got {name!r}: {needs!r}'
            )
        checked[name] = tuple(needs)
        if not all(isinstance(var, str) for var in checked[name]):
            raise TypeError(f"the vars of template {name!r} must be strings: {needs!r}")
    return checked


def _listed(name: str, needs: tuple[str, ...]) -> dict[str, object]:
    """A template's entry in the listing, when only its id and vars are given."""
    return {"id": name, "name": name, "channel": "rcs", "vars": list(needs)}


def _no_sessions(count: int) -> list[str | None]:
    return [None] * count


def _drop(request: web.Request) -> _Dropped:
    """Close the connection without an answer; the caller raises what this returns."""
    transport = request.transport
    if transport is not None:
        transport.close()
    return _Dropped()


def _endpoint_name(path: str) -> str:
    name = path.removeprefix(_API_PREFIX).strip("/")
    if name not in ENDPOINTS:
        raise ValueError(f"not a dispatch endpoint: {path!r} (one of {', '.join(ENDPOINTS)})")
    return name


def _bearer_token(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    # RFC 6750: the scheme is case-insensitive.
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def _accepts_json(accept: str) -> bool:
    accept = accept.lower()
    return any(t in accept for t in (_JSON, "application/*", "*/*"))


def _seconds_text(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def _json(status: int, body: object, *, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), headers=headers, content_type=_JSON)


def _raw(status: int, body: bytes, content_type: str) -> web.Response:
    # Through headers: aiohttp's content_type= refuses parameters such as charset.
    return web.Response(status=status, body=body, headers={"Content-Type": content_type})


def _status_response(fault: Fault) -> web.Response:
    response = _raw(fault.status_code, fault.body or b"", fault.content_type)
    if fault.retry_after is not None:
        response.headers["Retry-After"] = fault.retry_after
    return response


def _invalid_token() -> web.Response:
    return _json(
        401,
        {"error": "invalid_token"},
        headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
    )
