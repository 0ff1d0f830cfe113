"""The wire format: the one cattrs converter, and JSON in and out through orjson.

Request envelopes and token answers go through the converter. The per-recipient lists
of a dispatch do not: a million recipients through generic (un)structuring costs more
than the whole HTTP exchange, so they are plain dicts checked in bulk. A dispatch answer
is decoded and type-checked in one C pass by msgspec (about as fast as ``orjson.loads``
alone); anything that does not fit that shape exactly, unknown fields included (msgspec
skips those without checking them as orjson does), is read again with orjson for the
careful path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import attrs
import msgspec
import orjson
from cattrs.errors import ClassValidationError
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn
from cattrs.preconf.orjson import make_converter

from ._exceptions import AuthenticationError, MalformedResponseError
from ._models import Fallback
from ._packed import pack_ids, pack_sessions

__all__ = [
    "AnswerColumns",
    "Envelope",
    "TokenAnswer",
    "UnencodableError",
    "decode_answer",
    "decode_json",
    "encodable",
    "encode_dispatch",
    "parse_token_answer",
]

_converter = make_converter()


@attrs.frozen
class Envelope:
    """Everything in a dispatch request except the recipients (spec 2.1)."""

    account: str
    campaign_name: str | None = None
    fallback: tuple[Fallback, ...] | None = None
    text: str | None = None
    callback: str | None = attrs.field(default=None, repr=False)  # its token is a secret
    template_id: str | None = None
    webhook: str | None = attrs.field(default=None, repr=False)  # its token is a secret


@attrs.frozen
class TokenAnswer:
    """The token response (spec 2.6).

    ``expires_in`` is the JSON value as sent (None when absent): the vendor documents a
    string of unstated unit, so it is read later, leniently (`_lifetime`).
    """

    access_token: str = attrs.field(repr=False)
    expires_in: Any = None
    token_type: str = "Bearer"  # noqa: S105 - a scheme name, not a secret


def _unstructure_envelope(envelope: Envelope) -> dict[str, Any]:
    body = _envelope_fields(envelope)
    text = body.pop("text", None)
    if text is not None:
        body["content"] = {"text": {"message": text}}
    return body


_envelope_fields = make_dict_unstructure_fn(Envelope, _converter, _cattrs_omit_if_default=True)
_converter.register_unstructure_hook(Envelope, _unstructure_envelope)


def _strict_str(value: object, _: object) -> str:
    if type(value) is not str:
        raise TypeError(f"expected a string, not {type(value).__name__}")
    return value


_converter.register_structure_hook(str, _strict_str)
_converter.register_structure_hook(
    TokenAnswer,
    make_dict_structure_fn(
        TokenAnswer,
        _converter,
        _cattrs_forbid_extra_keys=False,
    ),
)


def parse_token_answer(body: bytes) -> TokenAnswer:
    """Read a token answer; an unreadable one is an AuthenticationError, never a guess."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None  # described below, outside the except: the parser error holds the body
    if data is None:
        raise AuthenticationError(f"the token answer is not JSON ({len(body)} bytes)")
    if not isinstance(data, dict):
        raise AuthenticationError("the token answer is not a JSON object")
    try:
        answer = _converter.structure(data, TokenAnswer)
    except (ClassValidationError, TypeError, ValueError) as exc:
        problem = _describe(exc)
    else:
        if not answer.access_token:
            problem = "its access_token is empty"
        elif answer.token_type.lower() != "bearer":
            problem = f"unsupported token_type {answer.token_type[:20]!r}"
        else:
            return answer
    # Raised here, not in the except: the cattrs error must not ride along.
    raise AuthenticationError(f"the token answer is not usable: {problem}")


def _describe(exc: Exception) -> str:
    if isinstance(exc, ClassValidationError):
        return "; ".join(
            _describe(e) if isinstance(e, Exception) else str(e) for e in exc.exceptions
        )
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    return str(exc)


class UnencodableError(ValueError):
    """Some text cannot be sent as JSON (UTF-8): a lone surrogate, from bytes decoded
    with ``surrogateescape``."""


def encode_dispatch(envelope: Envelope, messages: list[dict[str, Any]]) -> bytes:
    """The JSON body of one dispatch request; raises UnencodableError (see ``encodable``)."""
    body = _converter.unstructure(envelope)
    body["messages"] = messages
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        pass
    raise UnencodableError("a recipient has text that is not valid UTF-8")


def encodable(value: object) -> bool:
    """Whether *value* can go on the wire (only asked once encoding a whole body failed)."""
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return False
    return True


def decode_json(body: bytes) -> Any:
    """Parse JSON, turning garbage into a MalformedResponseError (the service may have acted).

    The error describes the answer but never quotes it: a token answer or an echoed
    request can carry credentials. It is raised outside the ``except`` so that no
    parser error (whose ``doc`` is the whole body) hangs on as its ``__context__``.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    raise MalformedResponseError(f"the answer is not JSON ({len(body)} bytes)")


class _Valid(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    id: Annotated[str, msgspec.Meta(min_length=1)]
    number: str
    # Seen from the real service: null for basic and single, the conversation otherwise.
    session_id: str | None = None


class _Invalid(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    number: str
    reason: str


class _Answer(msgspec.Struct, gc=False, rename="camel", forbid_unknown_fields=True):
    valid_messages: list[_Valid] = []
    invalid_messages: list[_Invalid] = []


_answer_decoder = msgspec.json.Decoder(_Answer)


@attrs.frozen
class AnswerColumns:
    """A dispatch answer of the expected shape, as columns; ``body`` for the careful path.

    Every id is a non-empty string, every number and reason a string, every session id
    a string or None (``session_ids`` is None when every one is). The ids and session
    ids are packed (``_packed``) as soon as they are decoded, while the entries are
    fresh in the cache, and the entries are then dropped; the numbers stay strings for
    the match.
    """

    ids: Sequence[str]
    valid_numbers: list[str]
    invalid_numbers: list[str]
    reasons: list[str]
    session_ids: Sequence[str | None] | None
    body: bytes = attrs.field(repr=False)


def decode_answer(body: bytes) -> AnswerColumns | Any:
    """A dispatch answer: columns when it has the expected shape, else what decode_json gives."""
    try:
        answer = _answer_decoder.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return decode_json(body)
    valid, invalid = answer.valid_messages, answer.invalid_messages
    # Comprehensions: their attribute loads are specialised, where map(attrgetter) is a
    # generic lookup per entry.
    return AnswerColumns(
        pack_ids([v.id for v in valid]),
        [v.number for v in valid],
        [i.number for i in invalid],
        [i.reason for i in invalid],
        pack_sessions([v.session_id for v in valid]),
        body,
    )
