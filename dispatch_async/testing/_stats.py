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

    token_calls: int = 0
    """Requests to ``POST /oauth/token``, whatever their outcome."""
    tokens_issued: int = 0
    """Tokens actually issued."""
    requests: int = 0
    """Every request under ``/api/v3``, including refused ones and the templates listing."""
    dispatch_calls: int = 0
    """Dispatch requests the service acted on."""
    calls_by_path: Counter[str] = attrs.field(factory=Counter)
    """Dispatch requests acted on, per endpoint name ("basic", "webhook", ...)."""
    received: Counter[str] = attrs.field(factory=Counter)
    """Every number of every request acted on, valid or not, with multiplicity."""
    recipients_received: int = 0
    """Total recipients acted on (the sum of ``received``)."""
    max_concurrent: int = 0
    """Peak number of ``/api/v3`` requests being handled at the same time."""
    unauthorized: int = 0
    """401 answers under ``/api/v3`` (bad tokens, revocations, scripted 401s)."""
    missing_token: int = 0
    """``/api/v3`` requests without a ``Bearer`` Authorization header."""
    unknown_token_uses: int = 0
    """``/api/v3`` requests with a token the server never issued."""
    expired_token_uses: int = 0
    """``/api/v3`` requests with an issued token past its lifetime."""
    revoked_token_uses: int = 0
    """``/api/v3`` requests with a revoked token."""
    forbidden: int = 0
    """403s answered to callers outside the server's ``allowed_ips``."""
    rate_limited: int = 0
    """429s answered because an account went over the server's ``rate_limit``."""
    faults_injected: int = 0
    """Faults applied, scripted or random."""
    dropped: int = 0
    """Connections closed without an answer (drop faults, or hangs cut by ``close``)."""
    status_counts: Counter[int] = attrs.field(factory=Counter)
    """Status of every answer the server gave, on any endpoint."""
    last_headers: dict[str, str] = attrs.field(factory=dict)
    """Headers of the last ``/api/v3`` request that matter to the contract, when sent: User-
    Agent, X-Auth-Type, Accept, Content-Type."""

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
