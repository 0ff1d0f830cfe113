"""Reading one delivery callback: lenient about what the vendor leaves open, strict about
what storing it needs; and what its type, channel and direction mean."""

from __future__ import annotations

import datetime as dt

import orjson
import pytest

import dispatch_async as da
from dispatch_async.callbacks import DeliveryEvent, DeliveryStatus, parse_event

S = DeliveryStatus


def body(**fields: object) -> bytes:
    event: dict[str, object] = {
        "reference": "7f9c1f0e-0000-4000-8000-000000000001",
        "campaign_name": "july-pix",
        "event_id": "ev-1",
        "direction": "inbound",
        "session_id": None,
        "user_id": "5511987654321",
        "timestamp": "2024-07-01T12:00:00.000Z",
        "channel": "RCS",
        "type": "DELIVERED",
    }
    event.update(fields)
    return orjson.dumps({k: v for k, v in event.items() if v is not ...})


class TestDocumentedFields:
    def test_reads_every_documented_field(self) -> None:
        event = parse_event(body(message={"text": "oi"}, session_id="s-1"))
        assert event.reference == "7f9c1f0e-0000-4000-8000-000000000001"
        assert event.campaign_name == "july-pix"
        assert event.event_id == "ev-1"
        assert event.direction == "inbound"
        assert event.session_id == "s-1"
        assert event.user_id == "5511987654321"
        assert event.channel == "RCS"
        assert event.type == "DELIVERED"
        assert event.message == {"text": "oi"}
        assert event.extra == {}

    def test_timestamp_becomes_an_aware_datetime(self) -> None:
        event = parse_event(body(timestamp="2024-07-01T09:00:00-03:00"))
        assert event.occurred_at == dt.datetime(2024, 7, 1, 12, 0, tzinfo=dt.UTC)

    def test_a_timestamp_without_offset_is_read_as_utc(self) -> None:
        event = parse_event(body(timestamp="2024-07-01T12:00:00"))
        assert event.occurred_at == dt.datetime(2024, 7, 1, 12, 0, tzinfo=dt.UTC)

    def test_an_unreadable_timestamp_is_kept_as_text_with_no_datetime(self) -> None:
        event = parse_event(body(timestamp="yesterday"))
        assert event.timestamp == "yesterday"
        assert event.occurred_at is None


class TestLenient:
    def test_unknown_fields_are_kept_raw(self) -> None:
        event = parse_event(body(attempt=2, carrier={"name": "vivo"}))
        assert event.extra == {"attempt": 2, "carrier": {"name": "vivo"}}

    def test_an_unknown_type_is_kept_as_it_came(self) -> None:
        event = parse_event(body(type="SOMETHING_NEW"))
        assert event.type == "SOMETHING_NEW"
        assert event.status is S.UNKNOWN

    def test_only_reference_is_required(self) -> None:
        event = parse_event(b'{"reference": "r-1"}')
        assert event == DeliveryEvent(reference="r-1", status=S.UNKNOWN, key=event.key)
        assert event.occurred_at is None

    def test_a_numeric_id_is_read_as_its_digits(self) -> None:
        event = parse_event(body(reference=12345, event_id=67))
        assert (event.reference, event.event_id) == ("12345", "67")

    def test_a_mistyped_field_is_none_and_its_raw_value_kept(self) -> None:
        event = parse_event(body(channel=["RCS"], message="oi"))
        assert event.channel is None
        assert event.message is None
        assert event.extra == {"channel": ["RCS"], "message": "oi"}

    def test_events_without_extra_fields_share_no_writable_mapping(self) -> None:
        first, second = parse_event(body()), parse_event(body(reference="m-2"))
        with pytest.raises(TypeError):
            first.extra["added"] = 1  # type: ignore[index]
        assert second.extra == {}

    def test_to_json_gives_back_what_was_sent(self) -> None:
        sent = orjson.loads(body(message={"text": "oi"}, attempt=2))
        sent.pop("session_id")  # null: the same as absent
        assert parse_event(orjson.dumps(sent)).to_json() == sent


class TestStrict:
    @pytest.mark.parametrize(
        ("raw", "why"),
        [
            (b"", "not JSON"),
            (b"reference=r-1", "not JSON"),
            (b'{"reference": "r-1"', "not JSON"),
            (b"[]", "not a JSON object"),
            (b'"r-1"', "not a JSON object"),
            (b"null", "not a JSON object"),
            (b"{}", "no reference"),
            (b'{"reference": ""}', "no reference"),
            (b'{"reference": null}', "no reference"),
            (b'{"reference": {"id": 1}}', "no reference"),
            (b'{"reference": true}', "no reference"),
        ],
    )
    def test_refuses_what_cannot_be_filed_under_a_message(self, raw: bytes, why: str) -> None:
        with pytest.raises(da.DeliveryEventError, match=why) as caught:
            parse_event(raw)
        assert caught.value.status == 400
        assert isinstance(caught.value, ValueError)

    def test_a_body_nested_too_deeply_to_store_is_a_400(self) -> None:
        deep = b'{"reference":"r","message":' + b'{"a":' * 300 + b"1" + b"}" * 300 + b"}"
        with pytest.raises(da.DeliveryEventError, match="nested too deeply") as caught:
            parse_event(deep)
        assert caught.value.status == 400

    def test_the_refusal_never_quotes_the_body(self) -> None:
        with pytest.raises(da.DeliveryEventError) as caught:
            parse_event(b'{"user_id": "5511987654321"}')
        assert "5511987654321" not in str(caught.value)


class TestEventKey:
    def test_a_redelivery_has_the_same_key_whatever_the_field_order(self) -> None:
        first = parse_event(b'{"reference": "r", "type": "READ", "event_id": "e"}')
        again = parse_event(b'{ "event_id":"e","type":"READ",  "reference":"r" }')
        assert first.key == again.key

    def test_a_null_field_and_a_missing_one_give_the_same_key(self) -> None:
        assert parse_event(body(session_id=None)).key == parse_event(body(session_id=...)).key

    def test_distinct_events_of_one_message_have_distinct_keys(self) -> None:
        keys = {
            parse_event(body(type="DELIVERED")).key,
            parse_event(body(type="READ")).key,
            parse_event(body(type="READ", timestamp="2024-07-01T12:00:01Z")).key,
            parse_event(body(type="text", event_id="ev-2")).key,
        }
        assert len(keys) == 4


class TestStatusVocabulary:
    @pytest.mark.parametrize(
        ("type_", "channel", "direction", "status"),
        [
            ("basic", "RCS", "outbound", S.SENT),
            ("single", "RCS", "outbound", S.SENT),
            ("conversacional", "RCS", "outbound", S.SENT),
            ("richCard", "RCS", "outbound", S.SENT),
            ("basic", "SMS", None, S.SENT),
            ("DELIVERED", "RCS", "inbound", S.DELIVERED),
            ("delivered", None, None, S.DELIVERED),
            ("DELIVERED", "SMS", "inbound", S.DELIVERED_SMS),
            ("DELIVERED", " sms ", "outbound", S.DELIVERED_SMS),
            ("READ", "RCS", "inbound", S.READ),
            ("EXCEPTION", "RCS", "inbound", S.FAILED),
            ("ERROR", "SMS", "outbound", S.FAILED),
            ("bloqueado por duplicidade", "SMS", "outbound", S.BLOCKED_DUPLICATE),
            ("BLOQUEADO_POR_DUPLICIDADE", None, None, S.BLOCKED_DUPLICATE),
            ("text", "RCS", "inbound", S.INTERACTION),
            ("image", "RCS", "inbound", S.INTERACTION),
            ("richCard", "RCS", "inbound", S.INTERACTION),
            ("interaction", "RCS", None, S.INTERACTION),
            ("SOMETHING_NEW", "RCS", "inbound", S.UNKNOWN),
            (None, "RCS", "outbound", S.UNKNOWN),
        ],
    )
    def test_type_channel_and_direction_give_the_status(
        self, type_: str | None, channel: str | None, direction: str | None, status: S
    ) -> None:
        event = parse_event(body(type=type_, channel=channel, direction=direction))
        assert event.status is status

    def test_the_ladder_never_lets_a_late_delivery_undo_a_read(self) -> None:
        assert S.READ.rank > S.DELIVERED.rank == S.DELIVERED_SMS.rank > S.SENT.rank
        assert S.INTERACTION.rank > S.READ.rank
        assert S.DELIVERED.rank > S.FAILED.rank == S.BLOCKED_DUPLICATE.rank > S.SENT.rank
        assert min(S, key=lambda s: s.rank) is S.UNKNOWN

    def test_every_status_but_unknown_proves_the_service_acted(self) -> None:
        assert [s for s in S if not s.confirms_sent] == [S.UNKNOWN]
