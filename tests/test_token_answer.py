"""Reading the token answer: expires_in in every shape a service sends, and refusing garbage."""

from __future__ import annotations

import orjson
import pytest

import dispatch_async as da
from dispatch_async._auth import DEFAULT_LIFETIME, MAX_LIFETIME, Token
from dispatch_async._wire import parse_token_answer


def answer(**fields: object) -> bytes:
    return orjson.dumps({"access_token": "tok", "token_type": "Bearer", **fields})


@pytest.mark.parametrize("value", ["3600", 3600, "3600.0", 3600.0, " 3600 "])
def test_expires_in_is_read_as_seconds_in_any_numeric_shape(value: object) -> None:
    assert parse_token_answer(answer(expires_in=value)).expires_in == 3600.0


@pytest.mark.parametrize("value", ["abc", "NaN", "Infinity", "-Infinity", -1, "-5", True, [], {}])
def test_an_unreadable_expires_in_is_refused_clearly(value: object) -> None:
    with pytest.raises(da.AuthenticationError, match="expires_in"):
        parse_token_answer(answer(expires_in=value))


@pytest.mark.parametrize("fields", [{"expires_in": 0}, {"expires_in": "0"}, {}])
def test_zero_or_missing_expires_in_means_a_short_default_not_forever(
    fields: dict[str, object],
) -> None:
    parsed = parse_token_answer(answer(**fields))
    assert parsed.expires_in is None
    token = Token.issued("tok", 100.0, parsed.expires_in)
    assert token.lifetime == DEFAULT_LIFETIME
    assert token.expires_at <= 100.0 + DEFAULT_LIFETIME


def test_a_huge_lifetime_is_capped() -> None:
    assert Token.issued("tok", 0.0, 1e12).lifetime == MAX_LIFETIME


def test_refresh_comes_before_expiry_with_a_margin_proportional_to_the_lifetime() -> None:
    for lifetime in (5.0, 60.0, 3600.0):
        token = Token.issued("tok", 0.0, lifetime)
        assert 0.70 * lifetime <= token.refresh_at <= 0.80 * lifetime
        assert token.refresh_at < token.expires_at < lifetime


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b"{}",
        b'{"access_token": 5}',
        b'{"access_token": ""}',
        b'{"access_token": "t", "token_type": "MAC"}',
    ],
)
def test_a_malformed_token_answer_is_an_authentication_error(body: bytes) -> None:
    with pytest.raises(da.AuthenticationError, match="the token answer is not"):
        parse_token_answer(body)


def test_unknown_fields_in_the_answer_are_ignored() -> None:
    assert parse_token_answer(answer(expires_in="60", scope="send")).access_token == "tok"


def test_the_token_never_shows_in_a_repr() -> None:
    parsed = parse_token_answer(answer(access_token="s3cr3t-token", expires_in="60"))
    token = Token.issued(parsed.access_token, 0.0, 60.0)
    assert "s3cr3t-token" not in repr(parsed)
    assert "s3cr3t-token" not in repr(token)
