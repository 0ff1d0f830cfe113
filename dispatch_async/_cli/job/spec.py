"""What a command is asked to do: the job spec (its exit codes and error: ``screen.problem``).

Every default here is the SDK's, read once from its public objects: the command line
never writes a chunk size, a concurrency or a retry count of its own.
"""

from __future__ import annotations

import inspect
import ssl
import sys
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any, Final, Literal, TextIO

import attrs

import dispatch_async as da

from ..reading.input import Format, InputProblem, Rows, open_rows
from ..screen.flags import CA_FILE, in_our_words
from ..screen.problem import Problem

__all__ = [
    "DEFAULTS",
    "Connection",
    "Display",
    "Endpoint",
    "InputSpec",
    "JobSpec",
    "SendSettings",
    "Target",
    "dedupe_key",
    "sent_as",
]


Endpoint = Literal["basic", "single", "template", "webhook"]


@attrs.frozen
class _Defaults:
    chunk_size: int
    concurrency: int
    timeout: float
    attempts: int
    max_retry_time: float
    key_prefix: str


def _sdk_defaults() -> _Defaults:
    batch, retry = da.BatchSettings(), da.RetryPolicy()
    timeout = inspect.signature(da.DispatchSession).parameters["timeout"].default
    return _Defaults(
        chunk_size=batch.chunk_size,
        concurrency=batch.max_concurrency,
        timeout=float(timeout),
        attempts=retry.attempts,
        max_retry_time=retry.max_time,
        key_prefix=da.DEFAULT_KEY_PREFIX,
    )


#: The SDK's defaults, as the command line shows and uses them.
DEFAULTS: Final = _sdk_defaults()


def _parameters(endpoint: str) -> frozenset[str]:
    # The session's own signature says which fields an endpoint takes.
    method = getattr(da.DispatchSession, f"stream_{endpoint}")
    return frozenset(inspect.signature(method).parameters)


_TAKES: Final = {name: _parameters(name) for name in ("basic", "single", "template", "webhook")}


@attrs.frozen
class Target:
    """The endpoint to call and the fields of every request."""

    endpoint: Endpoint
    text: str | None = None
    template_id: str | None = None
    webhook: str | None = None
    campaign_name: str | None = None
    fallback_sms: str | None = None
    callback: str | None = None

    def describe(self) -> str:
        """What is sent, for the first line of the output: "template 'pix_reminder'"."""
        if self.endpoint == "webhook":
            return f"webhook {self.webhook}"
        if self.template_id:
            return f"template {self.template_id!r}"
        text = self.text or ""
        return f"text {text[:40] + '...' if len(text) > 40 else text!r}"

    def stream(
        self,
        session: da.DispatchSession,
        messages: Any,
        account: str | None = None,
        **options: Any,
    ) -> AsyncGenerator[da.DispatchResult, None]:
        """``session.stream_<endpoint>`` with this target's fields; raises InputError."""
        fields = {
            "text": self.text,
            "template_id": self.template_id,
            "webhook": self.webhook,
            "campaign_name": self.campaign_name,
            "callback": self.callback,
            "fallback": None if self.fallback_sms is None else da.Fallback.sms(self.fallback_sms),
        }
        takes = _TAKES[self.endpoint]
        given = {k: v for k, v in fields.items() if v is not None and k in takes}
        stream = getattr(session, f"stream_{self.endpoint}")
        result: AsyncGenerator[da.DispatchResult, None] = stream(
            messages, account=account, **given, **options
        )
        return result


@attrs.frozen
class Connection:
    """Where the service is and how to talk to it; the secret never shows in a repr."""

    base_url: str | None
    client_secret: str | None = attrs.field(repr=False)
    account: str | None
    timeout: float = DEFAULTS.timeout
    attempts: int = DEFAULTS.attempts
    max_retry_time: float = DEFAULTS.max_retry_time
    rate: float | Literal["auto"] | None = None
    #: With ``rate="auto"``: the most it may learn.
    max_rate: float | None = None
    #: ``--proxy``: its URL may hold a password. None: the environment's (HTTPS_PROXY).
    proxy: str | None = attrs.field(default=None, repr=False)
    #: ``--ca-file``: a CA trusted besides the system's.
    ca_file: Path | None = None
    #: Whether HTTPS_PROXY and the like count (not for the demo's own simulator).
    trust_env: bool = True

    def rate_options(self) -> dict[str, Any]:
        """The rate, as a session and a ``RedisRateLimiter`` take it."""
        return {"requests_per_second": self.rate, "max_requests_per_second": self.max_rate}

    def session(self, **options: Any) -> da.DispatchSession:
        """A session on this connection (Problem if it is incomplete or refused)."""
        for value, what in (
            (self.base_url, "no service URL: set DISPATCH_BASE_URL or pass --base-url"),
            (
                self.client_secret,
                "no client secret: set DISPATCH_CLIENT_SECRET or pass --client-secret-file",
            ),
        ):
            if not value:
                raise Problem(what)
        assert self.base_url is not None
        assert self.client_secret is not None
        try:
            return da.DispatchSession(
                self.base_url,
                client_secret=self.client_secret,
                account=self.account,
                timeout=self.timeout,
                retry=da.RetryPolicy(attempts=self.attempts, max_time=self.max_retry_time),
                proxy=self.proxy,
                trust_env=self.trust_env,
                ssl=self._trusted(),
                **options,
            )
        except (da.DispatchError, ValueError, TypeError) as exc:
            raise Problem(in_our_words(exc)) from None

    def _trusted(self) -> ssl.SSLContext | None:
        """The system's CAs and ``--ca-file``'s; None without it (the environment's)."""
        if self.ca_file is None:
            return None
        try:
            return da.ssl_context(self.ca_file)
        except da.ConfigurationError as exc:
            raise Problem(f"{CA_FILE}: {exc}") from None


@attrs.frozen
class SendSettings:
    """How the rows are chunked, screened and paced: the SDK's batcher options."""

    chunk_size: int = DEFAULTS.chunk_size
    concurrency: int = DEFAULTS.concurrency
    dedupe: bool = False
    prevalidate: bool = False
    region: str | None = None
    deadline: float | None = None

    def options(self) -> da.BatchOptions:
        """The keyword arguments of a ``stream_*`` call."""
        return {
            "chunk_size": self.chunk_size,
            "max_concurrency": self.concurrency,
            "dedupe": self.dedupe,
            "prevalidate": self.prevalidate,
            "region": self.region,
            "deadline": self.deadline,
        }


@attrs.frozen
class InputSpec:
    """Which file to read, and how."""

    path: str
    format: Format = "auto"
    number_column: str = "number"
    columns: tuple[str, ...] | None = None
    delimiter: str | None = None
    #: The codec (None: UTF-8 or Windows-1252, as the file says).
    encoding: str | None = None
    #: ``--var``: ``(var, column)`` pairs; ``--only-vars``: no other column is sent.
    variables: tuple[tuple[str, str], ...] = ()
    only_vars: bool = False

    def open(self) -> Rows:
        """The rows of the input (Problem if it cannot be read)."""
        try:
            rows = open_rows(
                self.path,
                self.format,
                number_column=self.number_column,
                columns=self.columns,
                delimiter=self.delimiter,
                encoding=self.encoding,
                variables=self.variables,
                only_vars=self.only_vars,
            )
        except InputProblem as exc:
            raise Problem(f"{self.path}: {exc}") from None
        except OSError as exc:
            raise Problem(f"cannot read {self.path}: {exc.strerror}") from None
        if rows.kind == "jsonl" and (
            self.columns is not None
            or self.number_column != "number"
            or self.delimiter
            or self.encoding
            or self.variables
            or self.only_vars
        ):
            rows.close()
            raise Problem(
                "--columns, --number-column, --delimiter, --encoding, --var and --only-vars "
                "apply to CSV input only"
            )
        return rows


@attrs.frozen
class Display:
    """What the user sees."""

    title: str = "dispatch-async send"
    quiet: bool = False
    verbose: int = 0
    progress_every: float = 5.0
    stream: TextIO | None = None

    @property
    def err(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr


@attrs.frozen
class JobSpec:
    """Everything one ``send`` needs."""

    target: Target
    connection: Connection
    input: InputSpec
    output: Path | None
    settings: SendSettings = SendSettings()
    resume: bool = False
    resend_maybe_sent: bool = False
    display: Display = Display()
    #: What the journal of a new job stores, for ``--resume`` without flags.
    job_options: dict[str, Any] | None = None
    #: ``--exclude``: the file of numbers never to send.
    exclude: str | None = None
    #: ``--max-invalid``: the percent of the job's lines above which invalid ones fail it.
    max_invalid: float | None = None


def dedupe_key(settings: SendSettings) -> Callable[[str], str] | None:
    """The one form ``--dedupe`` compares numbers in, the SDK's (None without ``--dedupe``).

    E.164 with ``--prevalidate``; without it the number as written, so ``11987654322``
    and ``+5511987654322`` are two numbers.
    """
    if not settings.dedupe:
        return None
    if not settings.prevalidate:
        return str
    return _e164(settings.region)


def sent_as(settings: SendSettings) -> Callable[[str], str] | None:
    """The number the SDK puts on the wire for one given, with ``--prevalidate`` (E.164).

    None without it: the number is sent as written.
    """
    return _e164(settings.region) if settings.prevalidate else None


def _e164(region: str | None) -> Callable[[str], str]:
    try:
        da.to_e164("+5511987654321")
    except da.DispatchError as exc:  # pragma: no cover - depends on the installed extras
        raise Problem(str(exc)) from None

    def canonical(number: str) -> str:
        return da.to_e164(number, region) or number

    return canonical
