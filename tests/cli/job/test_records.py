"""The records of a part: one line per row, for every outcome the SDK reports."""

from __future__ import annotations

import json
from collections import Counter

import attrs

import dispatch_async as da
from dispatch_async._cli.job.records import part_records
from dispatch_async._cli.reading.rows import Row
from dispatch_async._models import invalid_messages, valid_messages
from tests.conftest import numbers


def _row(line: int, number: str) -> Row:
    return Row(line, number, {"number": number, "vars": {}})


def _failed(number: str, position: int, error: da.DispatchError) -> da.FailedRecipient:
    return da.FailedRecipient(da.Recipient(number), error, bool(error.maybe_sent), position)


class TestRecordsOfAPart:
    """In-process: ``part_records`` turns one chunk's result into one record per row."""

    def test_a_number_on_several_rows_is_matched_to_its_rows_in_input_order(self) -> None:
        one, two = numbers(2)
        rows = [_row(2, one), _row(3, two), _row(4, one), _row(5, one)]
        part = da.DispatchResult(
            range(4),
            valid=[da.ValidMessage("id-a", one, 0), da.ValidMessage("id-b", one, 2)],
            invalid=[da.InvalidMessage(two, "blocked", 1)],
            failed=[_failed(one, 3, da.TransportError("reset", maybe_sent=False))],
        )
        found, counts = part_records(rows, part)
        by = {r["line"]: r for r in map(json.loads, found)}
        assert (by[2]["id"], by[4]["id"]) == ("id-a", "id-b")
        assert by[3] == {"line": 3, "number": two, "outcome": "invalid", "reason": "blocked"}
        assert by[5] == {
            "line": 5, "number": one, "outcome": "not_sent",
            "error": "reset", "error_type": "TransportError",
        }  # fmt: skip
        assert counts == Counter(sent=2, invalid=1, not_sent=1)

    def test_outcomes_as_plain_lists_give_the_records_the_columns_give(self) -> None:
        one, two = numbers(2)
        rows = [_row(7, one), _row(9, two)]
        columns = da.DispatchResult(
            range(2),
            valid=valid_messages(["id-a"], [one], [0]),
            invalid=invalid_messages([two], ["blocked"], [1]),
        )
        lists = attrs.evolve(columns, valid=list(columns.valid), invalid=list(columns.invalid))
        assert part_records(rows, lists) == part_records(rows, columns)
        assert part_records(rows, columns)[1] == Counter(sent=1, invalid=1)

    def test_a_row_the_result_does_not_mention_is_maybe_sent_and_a_stranger_is_dropped(
        self,
    ) -> None:
        one, two, stranger = numbers(3)
        rows = [_row(2, one), _row(3, two)]
        accepted = valid_messages(["id-a", "id-x"], [one, stranger], [0, 1])
        parts = [
            da.DispatchResult(range(2), valid=accepted),
            da.DispatchResult(
                range(2),
                valid=accepted,
                invalid=invalid_messages([stranger], ["blocked"], [1]),
            ),
            da.DispatchResult(
                range(2),
                valid=accepted,
                failed=[_failed(stranger, 1, da.TransportError("reset", maybe_sent=False))],
            ),
        ]
        for part in parts:
            found, counts = part_records(rows, part, since="2026-11-27T16:00:00+00:00")
            by = {r["line"]: r for r in map(json.loads, found)}
            assert sorted(by) == [2, 3]
            assert by[2]["id"] == "id-a"
            assert by[3] == {
                "line": 3, "number": two, "outcome": "maybe_sent",
                "error": "the SDK gave no outcome for this row", "error_type": "Interrupted",
                "since": "2026-11-27T16:00:00+00:00",
            }  # fmt: skip
            assert counts == Counter(sent=1, maybe_sent=1)

    def test_a_failure_is_named_by_its_error_unless_explained_and_reported_when_asked(
        self,
    ) -> None:
        (one,) = numbers(1)
        part = da.DispatchResult(
            range(1), failed=[_failed(one, 0, da.TransportError("reset", maybe_sent=True))]
        )
        [plain], _ = part_records([_row(2, one)], part)
        assert json.loads(plain)["error"] == "reset"
        assert json.loads(plain)["error_type"] == "TransportError"
        failures: list[tuple[int, bool, str, str]] = []
        [told], counts = part_records(
            [_row(2, one)], part, lambda e: ("the line dropped", "Dropped"), failures=failures
        )
        assert json.loads(told)["error"] == "the line dropped"
        assert failures == [(2, True, "the line dropped", "Dropped")]
        assert counts == Counter(maybe_sent=1)
