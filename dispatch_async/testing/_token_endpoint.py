"""The OAuth token endpoint, and the token check every ``/api/v3`` request passes."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import orjson
from aiohttp import web

from ._faults import Fault, FaultKind, FaultSchedule
from ._replies import (
    JSON_CONTENT_TYPE,
    bearer_token,
    drop,
    invalid_token,
    json_answer,
    pause,
    raw_answer,
    seconds_text,
    status_answer,
)
from ._stats import ServerStats
from ._tokens import IssuedTokens, TokenState

__all__ = ["TokenEndpoint", "Unset"]


class Unset(enum.Enum):
    UNSET = enum.auto()


class TokenEndpoint:
    """``POST /oauth/token`` and the authentication of API requests, for `FakeDispatchServer`.

    The server sets the attributes these handlers read.
    """

    if TYPE_CHECKING:  # set by the server, which documents them: not attributes here
        client_secret: str
        jwt_tokens: bool
        token_body: Literal["form", "json", "any"]
        allowed_ips: frozenset[str] | None
        token_lifetime: float
        expires_in: object
        stats: ServerStats
        _faults: FaultSchedule
        _tokens: IssuedTokens
        _closing: asyncio.Event

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
            return json_answer(400, {"error": "unsupported_grant_type"})
        if form.get("client_secret") != self.client_secret:
            return json_answer(401, {"error": "invalid_client"})
        body: dict[str, object] = {
            "access_token": self._tokens.issue(self.token_lifetime, jwt=self.jwt_tokens),
            "token_type": "Bearer",
        }
        self.stats.tokens_issued += 1
        if self.expires_in is Unset.UNSET:
            body["expires_in"] = seconds_text(self.token_lifetime)
        elif self.expires_in is not None:
            body["expires_in"] = self.expires_in
        return json_answer(200, body, headers={"Cache-Control": "no-store"})

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
        return json_answer(403, {"message": f"IP address is not allowed: {request.remote}"})

    async def _token_fault(self, request: web.Request, fault: Fault) -> web.Response | None:
        match fault.kind:
            case FaultKind.STATUS:
                return status_answer(fault)
            case FaultKind.DELAY:
                await pause(self._closing, request, fault.seconds)
                return None
            case FaultKind.NOT_JSON:
                return raw_answer(200, fault.body or b"", fault.content_type)
            case FaultKind.WRONG_SHAPE:
                if fault.body is not None:
                    return raw_answer(200, fault.body, JSON_CONTENT_TYPE)
                shape = {"expires_in": seconds_text(self.token_lifetime), "token_type": "Bearer"}
                return json_answer(200, shape)
        # HANG, DROP and DROP_BEFORE (FaultSchedule lets no other kind through): no answer.
        if fault.kind is FaultKind.HANG:
            await pause(self._closing, request, None)
        raise drop(request)

    def _authenticate(self, request: web.Request) -> str | web.Response:
        """The presented token if usable, else the answer refusing the request."""
        refused = self._refuse_caller(request)
        if refused is not None:
            return refused
        token = bearer_token(request.headers.get("Authorization"))
        state = self._tokens.check(token)
        if state is TokenState.VALID:
            assert token is not None
            auth_type = request.headers.get("X-Auth-Type")
            if auth_type is not None and auth_type != "JWT":
                message = f"X-Auth-Type must be JWT, got {auth_type!r}"
                return json_answer(400, {"error": "invalid_auth_type", "message": message})
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
        return invalid_token()
