"""What the simulator saw, for tests to assert on and benchmarks to report."""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs

__all__ = ["ServerStats"]


@attrs.define
class ServerStats:
    """Counters kept by a `FakeDispatchServer`; plain attributes, reset with ``reset_stats``.

    "Acted on" means the service recorded the request's recipients as received: a
    normal answer, or a fault that happens after acting (see `Fault.acted`).
    """

    #: Requests to ``POST /oauth/token``, whatever their outcome.
    token_calls: int = 0
    #: Tokens actually issued.
    tokens_issued: int = 0
    #: Every request under ``/api/v3``, including refused ones and the templates listing.
    requests: int = 0
    #: Dispatch requests the service acted on.
    dispatch_calls: int = 0
    #: Dispatch requests acted on, per endpoint name ("basic", "webhook", ...).
    calls_by_path: Counter[str] = attrs.field(factory=Counter)
    #: Every number of every request acted on, valid or not, with multiplicity.
    received: Counter[str] = attrs.field(factory=Counter)
    #: Total recipients acted on (the sum of ``received``).
    recipients_received: int = 0
    #: Peak number of ``/api/v3`` requests being handled at the same time.
    max_concurrent: int = 0
    #: 401 answers under ``/api/v3`` (bad tokens, revocations, scripted 401s).
    unauthorized: int = 0
    #: ``/api/v3`` requests without a ``Bearer`` Authorization header.
    missing_token: int = 0
    #: ``/api/v3`` requests with a token the server never issued.
    unknown_token_uses: int = 0
    #: ``/api/v3`` requests with an issued token past its lifetime.
    expired_token_uses: int = 0
    #: ``/api/v3`` requests with a revoked token.
    revoked_token_uses: int = 0
    #: 403s answered to callers outside the server's ``allowed_ips``.
    forbidden: int = 0
    #: 429s answered because an account went over the server's ``rate_limit``.
    rate_limited: int = 0
    #: Faults applied, scripted or random.
    faults_injected: int = 0
    #: Connections closed without an answer (drop faults, or hangs cut by ``close``).
    dropped: int = 0
    #: Status of every answer the server gave, on any endpoint.
    status_counts: Counter[int] = attrs.field(factory=Counter)
    #: Headers of the last ``/api/v3`` request that matter to the contract, when sent:
    #: User-Agent, X-Auth-Type, Accept, Content-Type.
    last_headers: dict[str, str] = attrs.field(factory=dict)

    @property
    def duplicates(self) -> Counter[str]:
        """Numbers acted on more than once, with how many times; empty when none."""
        return Counter({number: n for number, n in self.received.items() if n > 1})

    def as_json(self) -> dict[str, Any]:
        """Every counter, JSON-ready (``received`` as its total and its duplicates only)."""
        out: dict[str, Any] = {}
        for field in attrs.fields(ServerStats):
            value = getattr(self, field.name)
            if field.name == "received":
                out["duplicates"] = dict(self.duplicates)
            elif isinstance(value, Counter):
                out[field.name] = {str(k): v for k, v in value.items()}
            else:
                out[field.name] = value
        return out

    @property
    def user_agent(self) -> str | None:
        """The User-Agent of the last ``/api/v3`` request."""
        return self.last_headers.get("User-Agent")
