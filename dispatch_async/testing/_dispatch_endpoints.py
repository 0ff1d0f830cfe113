"""The service's ``/api/v3`` endpoints: the dispatches, their faults, the templates listing."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import orjson
from aiohttp import web

from ._callbacks import CallbackSender
from ._contract import ENDPOINTS, FieldError, check_template, dispatch_answer, parse_dispatch
from ._faults import Fault, FaultKind
from ._ids import IdFactory
from ._rate import AccountRateLimit
from ._replies import (
    JSON_CONTENT_TYPE,
    accepts_json,
    drop,
    invalid_token,
    json_answer,
    pause,
    raw_answer,
    status_answer,
)
from ._token_endpoint import TokenEndpoint

__all__ = ["API_PREFIX", "DispatchEndpoints", "endpoint_name", "listed", "template_vars"]

API_PREFIX: Final = "/api/v3/"
#: The endpoints whose messages open a conversational session (a session_id).
_CONVERSATIONAL: Final = frozenset({"webhook", "template"})


class DispatchEndpoints(TokenEndpoint):
    """What `FakeDispatchServer` answers under ``/api/v3``, behind the token check.

    The server sets the attributes these handlers read.
    """

    if TYPE_CHECKING:  # set by the server, which documents them: not attributes here
        latency: float
        session_ids: bool
        template_vars: dict[str, tuple[str, ...]] | None
        templates: list[Mapping[str, object]]
        callbacks: CallbackSender | None
        _limit: AccountRateLimit
        _ids: IdFactory
        #: Wakes the server's ``wait_until`` callers.
        _notify: Callable[[], None]

    async def _list_templates(self, request: web.Request) -> web.StreamResponse:
        auth = self._authenticate(request)
        if isinstance(auth, web.Response):
            return auth
        accept = request.headers.get("Accept")
        if accept is not None and not accepts_json(accept):
            return json_answer(406, {"error": "not_acceptable", "message": "only application/json"})
        return json_answer(200, {"templates": [dict(t) for t in self.templates]})

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        response = await self._answer_dispatch(request, request.match_info["endpoint"])
        if self.latency > 0:
            await pause(self._closing, request, self.latency)
        return response

    async def _answer_dispatch(self, request: web.Request, endpoint: str) -> web.Response:
        auth = self._authenticate(request)
        if isinstance(auth, web.Response):
            return auth
        if request.content_type != JSON_CONTENT_TYPE:
            message = f"Content-Type must be {JSON_CONTENT_TYPE}, got {request.content_type}"
            return json_answer(415, {"error": "unsupported_media_type", "message": message})
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return json_answer(400, {"error": "invalid_json", "message": str(exc)})
        try:
            numbers = parse_dispatch(endpoint, body)
            if self.template_vars is not None:
                check_template(body, self.template_vars)
        except FieldError as exc:
            return json_answer(400, exc.to_json())
        wait = self._limit.take(body["account"])
        if wait is not None:
            self.stats.rate_limited += 1
            return json_answer(
                429, {"error": "rate_limited"}, headers={"Retry-After": f"{max(wait, 0.001):.3f}"}
            )
        fault = self._faults.for_dispatch(endpoint, numbers)
        if fault is None:
            return json_answer(200, self._act(endpoint, numbers, body))
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
                return status_answer(fault)
            case FaultKind.REVOKE_TOKEN:
                self._tokens.revoke(token)
                return invalid_token()
            case FaultKind.DROP | FaultKind.DROP_BEFORE:
                raise drop(request)
            case FaultKind.HANG:
                await pause(self._closing, request, None)
            case FaultKind.DELAY:
                await pause(self._closing, request, fault.seconds)
            case FaultKind.NOT_JSON:
                return raw_answer(200, fault.body or b"", fault.content_type)
            case FaultKind.WRONG_SHAPE:
                if fault.body is not None:
                    return raw_answer(200, fault.body, JSON_CONTENT_TYPE)
                return json_answer(200, self._answer(endpoint, numbers, drop_ids=True))
            case FaultKind.OMIT:
                kept = numbers[: max(0, len(numbers) - fault.count)]
                return json_answer(200, self._answer(endpoint, kept, like=acted))
            case FaultKind.DIGITS_ONLY:
                return json_answer(
                    200, self._answer(endpoint, numbers, like=acted, digits_only=True)
                )
        return json_answer(200, acted if acted is not None else self._answer(endpoint, numbers))

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


def template_vars(templates: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
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


def listed(name: str, needs: tuple[str, ...]) -> dict[str, object]:
    """A template's entry in the listing, when only its id and vars are given."""
    return {"id": name, "name": name, "channel": "rcs", "vars": list(needs)}


def _no_sessions(count: int) -> list[str | None]:
    return [None] * count


def endpoint_name(path: str) -> str:
    name = path.removeprefix(API_PREFIX).strip("/")
    if name not in ENDPOINTS:
        raise ValueError(f"not a dispatch endpoint: {path!r} (one of {', '.join(ENDPOINTS)})")
    return name
