"""The dispatch contract as the simulator enforces it (spec sections 2 and 4).

Which fields each dispatch endpoint takes, their types, which numbers are accepted, and
the shape of the answer. This is the simulator's own reading of the spec, kept apart from
the client SDK on purpose: the two must agree by both following the spec, not by sharing
code.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

__all__ = [
    "ENDPOINTS",
    "INVALID_NUMBER_REASON",
    "FieldError",
    "check_template",
    "dispatch_answer",
    "is_valid_number",
    "parse_dispatch",
]

ENDPOINTS: Final = ("basic", "single", "template", "webhook")

INVALID_NUMBER_REASON: Final = "number must be a valid phone number"

# The spec leaves "valid phone number" open; this is E.164's outline: an optional "+",
# then 8 to 15 ASCII digits not starting with 0. `[0-9]`, not `\d`, which takes any
# Unicode digit.
is_valid_number: Final[Callable[[str], object]] = re.compile(r"\+?[1-9][0-9]{7,14}").fullmatch

_NON_DIGITS: Final = re.compile(r"[^0-9]")

_OPTIONAL_COMMON: Final = frozenset({"campaign_name", "fallback", "callback"})

# Required fields are tuples so that a body missing several gets a stable answer.
_REQUIRED: Final[dict[str, tuple[str, ...]]] = {
    "webhook": ("account", "messages", "webhook"),
    "template": ("account", "messages", "template_id"),
    "basic": ("account", "content", "messages"),
    "single": ("account", "content", "messages"),
}

_ALLOWED: Final[dict[str, frozenset[str]]] = {
    "webhook": _OPTIONAL_COMMON | {"account", "messages", "webhook", "content", "template_id"},
    "template": _OPTIONAL_COMMON | {"account", "messages", "template_id", "webhook"},
    "basic": _OPTIONAL_COMMON | {"account", "content", "messages"},
    "single": _OPTIONAL_COMMON | {"account", "content", "messages"},
}

_STRING_FIELDS: Final = ("account", "campaign_name", "callback", "template_id", "webhook")


class FieldError(Exception):
    """A request the service refuses as a whole (400), naming the offending field."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field

    def to_json(self) -> dict[str, str]:
        """The 400 body: ``{"error": code, "message": text[, "field": name]}``."""
        body = {"error": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return body


def parse_dispatch(endpoint: str, body: object) -> list[str]:
    """Check a dispatch body against ``endpoint``'s field table.

    Returns:
        The recipient numbers, in message order.

    Raises:
        FieldError: the body is not an object, has a field the endpoint does not take,
            misses a required one, or has one of the wrong type.
    """
    if type(body) is not dict:
        raise FieldError("invalid_body", "request body must be a JSON object")
    allowed = _ALLOWED[endpoint]
    for name in body:
        if name not in allowed:
            raise FieldError("unknown_field", f"{name} is not a field of {endpoint}", name)
    for name in _REQUIRED[endpoint]:
        if name not in body:
            raise FieldError("missing_field", f"{name} is required", name)
    for name in _STRING_FIELDS:
        if name in body and type(body[name]) is not str:
            raise _invalid(name, "must be a string")
    if "content" in body:
        _check_content(body["content"])
    if "fallback" in body:
        _check_fallback(body["fallback"])
    return _numbers(body["messages"])


def check_template(body: dict[str, Any], templates: Mapping[str, Sequence[str]]) -> None:
    """Refuse a ``template_id`` the account has not, or a recipient without one of its vars.

    The spec shows neither answer; a 400 for the whole request, nothing acted on, is the
    simulator's choice (as for any other field it refuses). A var counts as given when
    the recipient's ``vars`` has its name, whatever the value; vars the template does
    not use are accepted.

    Raises:
        FieldError: ``unknown_template`` or ``missing_var``, naming the field.
    """
    template_id = body.get("template_id")
    if template_id is None:
        return
    needed = templates.get(template_id)
    if needed is None:
        known = ", ".join(map(repr, templates)) or "none"
        raise FieldError(
            "unknown_template",
            f"template_id {template_id!r} is not a template of this account (templates: {known})",
            "template_id",
        )
    if not needed:
        return
    for index, recipient in enumerate(body["messages"]):
        given = recipient.get("vars") or {}
        missing = [name for name in needed if name not in given]
        if missing:
            raise FieldError(
                "missing_var",
                f"messages[{index}].vars has no {', '.join(map(repr, missing))}: template "
                f"{template_id!r} needs {', '.join(map(repr, needed))}",
                f"messages[{index}].vars.{missing[0]}",
            )


def dispatch_answer(
    numbers: list[str],
    take_ids: Callable[[int], list[str]],
    *,
    digits_only: bool = False,
    drop_ids: bool = False,
    take_sessions: Callable[[int], Sequence[str | None]] | None = None,
) -> dict[str, Any]:
    """The 200 body for ``numbers``: valid ones with a fresh id, the others with a reason.

    Both lists keep input order. ``digits_only`` and ``drop_ids`` are the deliberate
    distortions used by faults. ``take_sessions`` gives each valid one a ``session_id``
    (as the real service does: null for basic and single); None leaves the field out.
    """
    accepted: list[str] = []
    rejected: list[dict[str, str]] = []
    reject = rejected.append
    accept = accepted.append
    valid = is_valid_number
    for number in numbers:
        if valid(number):
            accept(number)
        else:
            reject({"number": number, "reason": INVALID_NUMBER_REASON})
    if digits_only:
        strip = _NON_DIGITS.sub
        accepted = [strip("", number) for number in accepted]
        for item in rejected:
            item["number"] = strip("", item["number"])
    valid_messages: list[dict[str, str | None]]
    if drop_ids:
        valid_messages = [{"number": number} for number in accepted]
    else:
        valid_messages = [
            {"id": id_, "number": number}
            for id_, number in zip(take_ids(len(accepted)), accepted, strict=True)
        ]
    if take_sessions is not None and not drop_ids:
        sessions = take_sessions(len(valid_messages))
        for message, session in zip(valid_messages, sessions, strict=True):
            message["session_id"] = session
    return {"validMessages": valid_messages, "invalidMessages": rejected}


def _numbers(messages: object) -> list[str]:
    if type(messages) is not list or not messages:
        raise _invalid("messages", "must be a non-empty array of recipient objects")
    numbers: list[str] = []
    append = numbers.append
    # The one per-recipient loop of a request: exact type checks (orjson only makes
    # plain dicts and strs) and the rare extra keys checked off the fast path.
    for index, recipient in enumerate(messages):
        if type(recipient) is not dict:
            raise _invalid(f"messages[{index}]", "must be a recipient object")
        number = recipient.get("number")
        if type(number) is not str:
            raise _invalid(f"messages[{index}].number", "must be a string")
        if len(recipient) != 1:
            # Inlined: a recipient with vars is the common bulk case.
            vars_ = recipient.get("vars")
            if len(recipient) != 2 or type(vars_) is not dict:
                _check_recipient_extras(index, recipient)
            else:
                for value in vars_.values():
                    if type(value) is not str:
                        _check_recipient_extras(index, recipient)
        append(number)
    return numbers


def _check_recipient_extras(index: int, recipient: dict[str, Any]) -> None:
    for key, value in recipient.items():
        if key == "number":
            continue
        if key != "vars":
            raise FieldError(
                "unknown_field", f"{key} is not a field of a recipient", f"messages[{index}].{key}"
            )
        if type(value) is not dict:
            raise _invalid(f"messages[{index}].vars", "must be an object")
        for name, var in value.items():
            if type(var) is not str:
                raise _invalid(f"messages[{index}].vars.{name}", "must be a string")


def _check_content(content: object) -> None:
    if type(content) is not dict or set(content) != {"text"}:
        raise _invalid("content", 'must be {"text": {"message": <string>}}')
    text = content["text"]
    if type(text) is not dict or set(text) != {"message"}:
        raise _invalid("content.text", 'must be {"message": <string>}')
    if type(text["message"]) is not str:
        raise _invalid("content.text.message", "must be a string")


def _check_fallback(fallback: object) -> None:
    if type(fallback) is not list:
        raise _invalid("fallback", "must be an array of fallback objects")
    for index, item in enumerate(fallback):
        if type(item) is not dict or set(item) != {"channel", "content"}:
            raise _invalid(f"fallback[{index}]", "must be {channel, content}")
        for key in ("channel", "content"):
            if type(item[key]) is not str:
                raise _invalid(f"fallback[{index}].{key}", "must be a string")


def _invalid(field: str, problem: str) -> FieldError:
    return FieldError("invalid_field", f"{field} {problem}", field)
