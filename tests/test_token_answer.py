"""Reading the token answer: a lifetime from every shape a service sends, garbage refused."""

from __future__ import annotations

import base64
import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dispatch_async as da
from dispatch_async._auth import DEFAULT_LIFETIME, MAX_LIFETIME, Token
from dispatch_async._lifetime import jwt_claims_lifetime, parse_lifetime
from dispatch_async._wire import parse_token_answer

NOW = 1_800_000_000.0


def answer(**fields: object) -> bytes:
    return orjson.dumps({"access_token": "tok", "token_type": "Bearer", **fields})


def jwt(payload: object, *, raw_payload: bytes | None = None) -> str:
    def segment(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    body = raw_payload if raw_payload is not None else orjson.dumps(payload)
    header = segment(orjson.dumps({"alg": "HS256"}))
    return f"{header}.{segment(body)}.{segment(b'sig')}"


class TestExpiresIn:
    @pytest.mark.parametrize("value", ["3600", 3600, "3600.0", 3600.0, " 3600 ", "3600s"])
    def test_seconds_are_read_in_any_numeric_shape(self, value: object) -> None:
        assert parse_lifetime(value) == 3600.0

    @pytest.mark.parametrize(
        ("value", "seconds"),
        [
            ("3s", 3.0),
            ("60m", 3600.0),
            ("1h", 3600.0),
            ("1d", 86400.0),
            ("1h30m", 5400.0),
            ("1h 30m 15s", 5415.0),
            ("2 days", 172800.0),
            ("90 mins", 5400.0),
            ("1.5h", 5400.0),
            ("1H", 3600.0),
            ("1500ms", 1.5),
            ("1w", 604800.0),
        ],
    )
    def test_durations_as_node_jwt_stacks_write_them_are_read(
        self, value: str, seconds: float
    ) -> None:
        assert parse_lifetime(value) == pytest.approx(seconds)

    @pytest.mark.parametrize(
        "value",
        [
            "<time>",
            "abc",
            "NaN",
            "nan",
            "Infinity",
            "-Infinity",
            -1,
            "-5",
            "-1h",
            True,
            False,
            [],
            {},
            None,
            0,
            "0",
            "0s",
            "1x",
            "h1",
            "1h-",
            "",
            math.inf,
            "9" * 400,
        ],
    )
    def test_an_unreadable_or_absurd_lifetime_is_unknown_not_an_error(self, value: object) -> None:
        assert parse_lifetime(value) is None

    @given(
        st.recursive(
            st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=80),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=5), inner, max_size=3)
            ),
            max_leaves=6,
        )
    )
    def test_no_expires_in_whatever_its_value_refuses_a_usable_token(self, value: object) -> None:
        try:
            body = answer(expires_in=value)
        except orjson.JSONEncodeError:  # NaN and huge integers have no JSON form
            return
        parsed = parse_token_answer(body)
        assert parsed.access_token == "tok"
        lifetime = parse_lifetime(parsed.expires_in)
        assert lifetime is None or (math.isfinite(lifetime) and lifetime > 0)


class TestJwtClaims:
    def test_exp_gives_the_time_left_by_this_clock(self) -> None:
        assert jwt_claims_lifetime(jwt({"exp": NOW + 30}), NOW) == 30.0

    def test_iat_bounds_the_lifetime_when_this_clock_runs_behind_the_issuer(self) -> None:
        # Issued "now" by the issuer's clock, which is an hour ahead of ours.
        token = jwt({"iat": NOW + 3600, "exp": NOW + 3600 + 300})
        assert jwt_claims_lifetime(token, NOW) == 300.0

    def test_a_token_reissued_unchanged_has_only_what_is_left_of_it(self) -> None:
        token = jwt({"iat": NOW - 3000, "exp": NOW + 600})
        assert jwt_claims_lifetime(token, NOW) == 600.0

    @pytest.mark.parametrize(
        "token",
        [
            "opaque-token",
            "a.b",
            "a.b.c.d",
            jwt(None, raw_payload=b"not json"),
            jwt([1, 2]),
            jwt({"sub": "x"}),
            jwt({"exp": "soon"}),
            jwt({"exp": True}),
            jwt({"exp": NOW - 5}),
            "header.!!!.sig",
        ],
    )
    def test_no_usable_exp_is_unknown(self, token: str) -> None:
        assert jwt_claims_lifetime(token, NOW) is None


class TestTokenLifetime:
    def test_zero_or_missing_lifetime_means_a_short_default_not_forever(self) -> None:
        token = Token.issued("tok", 100.0, None)
        assert token.lifetime == DEFAULT_LIFETIME
        assert token.expires_at <= 100.0 + DEFAULT_LIFETIME

    def test_a_huge_lifetime_is_capped(self) -> None:
        assert Token.issued("tok", 0.0, 1e12).lifetime == MAX_LIFETIME

    @pytest.mark.parametrize("lifetime", [0.5, 3.0, 5.0, 60.0, 3600.0])
    def test_refresh_comes_before_expiry_with_a_margin_proportional_to_the_lifetime(
        self, lifetime: float
    ) -> None:
        token = Token.issued("tok", 0.0, lifetime)
        assert 0.70 * lifetime <= token.refresh_at <= 0.80 * lifetime
        assert token.refresh_at < token.expires_at < lifetime

    @pytest.mark.parametrize(
        ("lifetime", "unused_for"), [(0.5, 0.075), (3.0, 0.45), (10.0, 0.5), (60.0, 3.0)]
    )
    def test_a_short_lived_token_is_given_up_early_enough_to_reach_the_service_in_time(
        self, lifetime: float, unused_for: float
    ) -> None:
        # A loaded machine takes tens of milliseconds from the check to the service: 5%
        # of a 3 s token (0.15 s) was too little, so short tokens get up to 0.5 s.
        token = Token.issued("tok", 0.0, lifetime)
        assert lifetime - token.expires_at == pytest.approx(unused_for)


class TestMalformedAnswer:
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
    def test_a_malformed_token_answer_is_an_authentication_error(self, body: bytes) -> None:
        with pytest.raises(da.AuthenticationError, match="the token answer is not"):
            parse_token_answer(body)

    @pytest.mark.parametrize(
        ("body", "problem"),
        [
            (b"not json", "the token answer is not JSON (8 bytes)"),
            (b"[]", "the token answer is not a JSON object"),
            (b"{}", "the token answer is not usable: missing field 'access_token'"),
            (b'{"access_token": 5}', "the token answer is not usable: expected a string, not int"),
            (
                b'{"access_token": 5, "token_type": null}',
                "the token answer is not usable: expected a string, not int; "
                "expected a string, not NoneType",
            ),
            (b'{"access_token": ""}', "the token answer is not usable: its access_token is empty"),
            (
                b'{"access_token": "t", "token_type": "MAC"}',
                "the token answer is not usable: unsupported token_type 'MAC'",
            ),
            (
                b'{"access_token": "t", "token_type": "' + b"x" * 25 + b'"}',
                "the token answer is not usable: unsupported token_type '" + "x" * 20 + "'",
            ),
        ],
    )
    def test_the_problem_is_told_exactly(self, body: bytes, problem: str) -> None:
        with pytest.raises(da.AuthenticationError) as caught:
            parse_token_answer(body)
        assert str(caught.value) == problem

    def test_unknown_fields_in_the_answer_are_ignored(self) -> None:
        assert parse_token_answer(answer(expires_in="60", scope="send")).access_token == "tok"

    def test_the_token_never_shows_in_a_repr(self) -> None:
        parsed = parse_token_answer(answer(access_token="s3cr3t-token", expires_in="60"))
        token = Token.issued(parsed.access_token, 0.0, 60.0)
        assert "s3cr3t-token" not in repr(parsed)
        assert "s3cr3t-token" not in repr(token)
