"""A collected result is compact and reads back exactly what the service said.

Ids the service gives as UUIDs are kept as 16 bytes, any other id as given; numbers
(whatever their characters) and reasons read back as they went in; a merge of many
chunk results indexes, slices, iterates and compares like the list of its outcomes; and
a result holds a bounded number of bytes per recipient, not an object per recipient.
"""

from __future__ import annotations

import gc
import pickle
import tracemalloc
import uuid
from collections.abc import Callable

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dispatch_async as da
from dispatch_async._matching import result_from_answer
from dispatch_async._models import invalid_messages, valid_messages
from dispatch_async._outcome import merge_results
from dispatch_async._recipients import Chunk
from dispatch_async._wire import decode_answer

#: Ids of every shape a service could give; only the first is kept as 16 bytes.
ID_SHAPES = {
    "uuid": "0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f901234",
    "uppercase uuid": "0F8C2E7A-4B1D-4C3E-9A5F-6D7E8F901234",
    "mixed-case uuid": "0f8c2e7a-4B1d-4c3e-9a5f-6d7e8f901234",
    "uuid without dashes": "0f8c2e7a4b1d4c3e9a5f6d7e8f901234",
    "uuid in braces": "{0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f901234}",
    "dashes in place, not hex": "0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f90123z",
    "dashes elsewhere": "0f8c2e7a4-b1d-4c3e-9a5f-6d7e8f901234",
    "spaces for hex digits": "0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f9012 4",
    "an extra dash": "0f8c2e7a-4b1d-4c3e-9a5f-6d7e-f901234",
    "non-ASCII": "0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f90123é",
    "a counter": "12345",
    "a word": "msg_abc",
    "one character": "x",
    "long": "id-" + "9" * 200,
}


def _numbers(count: int, start: int = 0) -> list[str]:
    return [f"+55119{i:08d}" for i in range(start, start + count)]


def _uuids(count: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(count)]


class TestIdsReadBackAsGiven:
    @pytest.mark.parametrize("shape", sorted(ID_SHAPES))
    def test_an_id_of_any_shape_reads_back_exactly(self, shape: str) -> None:
        given = [ID_SHAPES[shape], *_uuids(3)]  # one odd id among UUIDs, and alone
        for ids in (given, given[:1]):
            valid = valid_messages(ids, _numbers(len(ids)), range(len(ids)))
            assert list(valid.ids) == ids
            assert [valid.ids[i] for i in range(len(ids))] == ids
            assert [m.id for m in valid] == ids
            assert valid[0].id == ids[0]

    def test_ids_one_short_and_one_long_of_a_uuid_read_back_exactly(self) -> None:
        short, long = _uuids(2)
        ids = [short[:-1], long + "0", *_uuids(2)]  # as long together as four UUIDs
        valid = valid_messages(ids, _numbers(4), range(4))
        assert list(valid.ids) == ids
        assert [valid.ids[i] for i in range(4)] == ids

    @pytest.mark.parametrize("letter", "ABCDEF")
    def test_a_uuid_with_one_uppercase_hex_digit_reads_back_exactly(self, letter: str) -> None:
        odd = f"0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f90123{letter}"
        ids = [*_uuids(2), odd]
        valid = valid_messages(ids, _numbers(3), range(3))
        assert list(valid.ids) == ids
        assert valid.ids[2] == odd

    @given(st.lists(st.uuids(), min_size=1, max_size=50))
    def test_uuids_read_back_in_their_lowercase_form(self, drawn: list[uuid.UUID]) -> None:
        ids = [str(u) for u in drawn]
        valid = valid_messages(ids, _numbers(len(ids)), range(len(ids)))
        assert list(valid.ids) == ids
        assert [valid.ids[-i] for i in range(1, len(ids) + 1)] == ids[::-1]

    @given(st.lists(st.text(min_size=1), min_size=1, max_size=30))
    def test_any_text_reads_back_as_an_id(self, ids: list[str]) -> None:
        valid = valid_messages(ids, _numbers(len(ids)), range(len(ids)))
        assert list(valid.ids) == ids
        assert [valid.ids[i] for i in range(len(ids))] == ids


class TestSessionIds:
    def test_a_basic_answer_s_null_session_ids_read_as_a_list_of_none(self) -> None:
        result = _answered(0, 200, sessions=False)
        assert isinstance(result.valid, da.ValidMessages)
        sessions = result.valid.session_ids
        assert sessions == [None] * 198
        assert repr(sessions) == repr([None] * 198)
        assert sessions[-1] is None

    @pytest.mark.parametrize(
        "sessions",
        [_uuids(5), [*_uuids(2), None, "conversa-7", None], ["a", "b", "c", "d", "e"]],
        ids=["uuids", "mixed", "words"],
    )
    def test_session_ids_read_back_as_given(self, sessions: list[str | None]) -> None:
        valid = valid_messages(_uuids(5), _numbers(5), range(5), session_ids=sessions)
        assert list(valid.session_ids) == sessions
        assert [valid.session_ids[i] for i in range(5)] == sessions
        assert [m.session_id for m in valid] == sessions


class TestNumbersAndReasons:
    @given(st.lists(st.text(min_size=1), min_size=1, max_size=30))
    def test_numbers_of_any_characters_read_back(self, numbers: list[str]) -> None:
        valid = valid_messages(_uuids(len(numbers)), numbers, range(len(numbers)))
        invalid = invalid_messages(numbers, ["no"] * len(numbers), range(len(numbers)))
        for column in (valid.numbers, invalid.numbers):
            assert list(column) == numbers
            assert [column[i] for i in range(len(numbers))] == numbers

    def test_non_ascii_numbers_read_back(self) -> None:
        numbers = ["+55 (11) 9८७६५-४३२१", "+5511987654321", "☎ 11 98765", "+55\u00a011 9876"]
        positions = [3, 5, 8, 13]
        valid = valid_messages(_uuids(4), numbers, positions)
        assert [(m.number, m.position) for m in valid] == list(zip(numbers, positions, strict=True))

    def test_a_reason_given_many_times_is_kept_once(self) -> None:
        reasons = [f"invalid number {i % 2}" for i in range(1000)]
        numbers = _numbers(1000)
        invalid = invalid_messages(numbers, reasons, range(1000))
        assert list(invalid.reasons) == reasons
        assert invalid[999] == da.InvalidMessage(numbers[999], "invalid number 1", 999)
        first, second = invalid.reasons[0], invalid.reasons[2]
        assert first == second
        assert first is second

    def test_positions_given_as_a_list_read_back(self) -> None:
        positions = [7, 2**40, 0, 12]
        invalid = invalid_messages(_numbers(4), ["r"] * 4, positions)
        assert list(invalid.positions) == positions
        assert [m.position for m in invalid] == positions


def _part(start: int, count: int, ids: list[str]) -> da.DispatchResult:
    """A chunk's result: every third recipient rejected, the others accepted."""
    positions = range(start, start + count)
    numbers = _numbers(count, start)
    accepted = [i for i in range(count) if i % 3]
    rejected = [i for i in range(count) if not i % 3]
    return da.DispatchResult(
        positions,
        valid_messages(
            ids[: len(accepted)],
            [numbers[i] for i in accepted],
            [positions[i] for i in accepted],
        ),
        invalid_messages(
            [numbers[i] for i in rejected],
            [f"reason {i % 4}" for i in rejected],
            [positions[i] for i in rejected],
        ),
    )


class TestMergedResults:
    def _merged(self) -> tuple[da.DispatchResult, list[da.ValidMessage], list[da.InvalidMessage]]:
        parts, start = [], 0
        for k in range(60):
            count = k % 7 * 5  # some parts empty
            shape = sorted(ID_SHAPES)[k % len(ID_SHAPES)]
            ids = _uuids(count) if k % 2 else [f"{ID_SHAPES[shape]}-{i}" for i in range(count)]
            parts.append(_part(start, count, ids))
            start += count
        expected_valid = [m for p in parts for m in list(p.valid)]
        expected_invalid = [m for p in parts for m in list(p.invalid)]
        return merge_results(reversed(parts)), expected_valid, expected_invalid

    def test_a_merge_of_many_parts_reads_like_the_list_of_its_outcomes(self) -> None:
        merged, valid, invalid = self._merged()
        for got, expected in ((merged.valid, valid), (merged.invalid, invalid)):
            assert len(got) == len(expected)
            assert list(got) == expected
            assert got == expected
            assert [got[i] for i in range(len(got))] == expected
            assert [got[-i] for i in range(1, len(got) + 1)] == expected[::-1]
            assert list(got[5:40:3]) == expected[5:40:3]
            with pytest.raises(IndexError):
                got[len(expected)]
        columns, rejected = merged.valid, merged.invalid
        assert isinstance(columns, da.ValidMessages)
        assert isinstance(rejected, da.InvalidMessages)
        assert list(columns.ids) == [m.id for m in valid]
        assert list(columns.positions) == [m.position for m in valid]
        assert [columns.positions[i] for i in range(len(valid))] == [m.position for m in valid]
        assert list(rejected.reasons) == [m.reason for m in invalid]

    def test_a_merged_result_pickles_and_reads_back_the_same(self) -> None:
        merged, valid, invalid = self._merged()
        again = pickle.loads(pickle.dumps(merged))  # noqa: S301 - our own bytes
        assert list(again.valid) == valid
        assert list(again.invalid) == invalid
        assert isinstance(again.valid, da.ValidMessages)
        assert isinstance(merged.valid, da.ValidMessages)
        assert again.valid.ids == merged.valid.ids


def _answered(start: int, size: int, sessions: bool) -> da.DispatchResult:
    """A chunk's result from the service's answer as the wire decoder reads it: every
    hundredth number rejected, session ids null (basic) or UUIDs (template)."""
    numbers = _numbers(size, start)
    chunk = Chunk(start, size, [{"number": n} for n in numbers])
    body = orjson.dumps(
        {
            "validMessages": [
                {
                    "id": str(uuid.uuid4()),
                    "number": n,
                    "session_id": str(uuid.uuid4()) if sessions else None,
                }
                for i, n in enumerate(numbers)
                if i % 100
            ],
            "invalidMessages": [
                {"number": n, "reason": "invalid number"}
                for i, n in enumerate(numbers)
                if not i % 100
            ],
        }
    )
    return result_from_answer(chunk, decode_answer(body))


def _json_text(spelled: str | None) -> str:
    return "null" if spelled is None else f'"{spelled}"'


def _decoded(valid: list[str], sessions: list[str | None]) -> da.DispatchResult:
    """A chunk's result from an answer whose entries are given as JSON text: ids and
    session ids spelled as the service might spell them (escapes included)."""
    numbers = _numbers(len(valid))
    entries = ",".join(
        f'{{"id":"{id_}","number":"{n}","session_id":{_json_text(s)}}}'
        for id_, n, s in zip(valid, numbers, sessions, strict=True)
    )
    body = f'{{"validMessages":[{entries}],"invalidMessages":[]}}'.encode()
    chunk = Chunk(0, len(numbers), [{"number": n} for n in numbers])
    return result_from_answer(chunk, decode_answer(body))


class TestIdsDecodedFromAnAnswer:
    """An answer's ids and session ids are packed as it is decoded: each reads back as the
    service gave it, whatever its shape and however its JSON spells it."""

    @pytest.mark.parametrize("shape", sorted(ID_SHAPES))
    def test_an_id_of_any_shape_reads_back(self, shape: str) -> None:
        odd = orjson.dumps(ID_SHAPES[shape]).decode()[1:-1]  # as JSON spells it
        uuids = _uuids(4)
        result = _decoded([*uuids[:2], odd, *uuids[2:]], [*uuids, odd])
        assert list(result.valid.ids) == [*uuids[:2], ID_SHAPES[shape], *uuids[2:]]
        assert list(result.valid.session_ids) == [*uuids, ID_SHAPES[shape]]
        assert [m.id for m in result.valid][2] == ID_SHAPES[shape]

    @pytest.mark.parametrize(
        ("spelled", "meant"),
        [
            ("\\u0030f8c2e7a-4b1d-4c3e-9a5f-6d7e8f901234", "0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f901234"),
            ("0f8c2e7a\\u002d4b1d-4c3e-9a5f-6d7e8f901234", "0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f901234"),
            ("\\u0046f8c2e7a-4b1d-4c3e-9a5f-6d7e8f901234", "Ff8c2e7a-4b1d-4c3e-9a5f-6d7e8f901234"),
            (
                "0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f90123\\u0000",
                "0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f90123\x00",
            ),
            ("0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f9012\\/4", "0f8c2e7a-4b1d-4c3e-9a5f-6d7e8f9012/4"),
        ],
        ids=["escaped digit", "escaped dash", "escaped uppercase", "escaped NUL", "escaped slash"],
    )
    def test_an_id_spelled_with_escapes_reads_back_as_it_decodes(
        self, spelled: str, meant: str
    ) -> None:
        uuids = _uuids(3)
        result = _decoded([uuids[0], spelled, uuids[1]], [spelled, uuids[2], None])
        assert list(result.valid.ids) == [uuids[0], meant, uuids[1]]
        assert list(result.valid.session_ids) == [meant, uuids[2], None]

    def test_uuid_ids_and_session_ids_are_kept_as_16_bytes_each(self) -> None:
        ids, sessions = _uuids(500), _uuids(500)
        result = _decoded(ids, sessions)
        assert isinstance(result.valid, da.ValidMessages)
        assert list(result.valid.ids) == ids
        assert list(result.valid.session_ids) == sessions
        for column in (result.valid.ids, result.valid.session_ids):
            assert type(column).__name__ == "Ids"


def _held_per_recipient(make: Callable[[], da.DispatchResult], count: int) -> float:
    """Bytes a result made by *make* keeps per recipient, once everything else is freed."""
    gc.collect()
    tracemalloc.start()
    try:
        floor = tracemalloc.get_traced_memory()[0]
        result = make()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - floor
    finally:
        tracemalloc.stop()
    assert len(result.valid) + len(result.invalid) == count
    return held / count


class TestSize:
    """What a result keeps, counted by tracemalloc after its inputs are gone: bytes, not
    objects, per recipient (64 is the benchmark's target for the RSS of a whole call)."""

    CHUNKS, SIZE = 20, 1000

    def test_a_merged_result_keeps_at_most_48_bytes_per_recipient(self) -> None:
        chunks, size = self.CHUNKS, self.SIZE
        held = _held_per_recipient(
            lambda: merge_results([_part(k * size, size, _uuids(size)) for k in range(chunks)]),
            chunks * size,
        )
        assert held <= 48

    @pytest.mark.parametrize("sessions", [False, True], ids=["basic", "template"])
    def test_a_result_from_decoded_answers_keeps_at_most_48_bytes_per_recipient(
        self, sessions: bool
    ) -> None:
        """The decoded entries are not kept: ids, and session ids when there are any,
        are 16 bytes each, numbers their characters and an offset."""
        chunks, size = self.CHUNKS, self.SIZE
        held = _held_per_recipient(
            lambda: merge_results(_answered(k * size, size, sessions) for k in range(chunks)),
            chunks * size,
        )
        assert held <= 48 + 16 * sessions
