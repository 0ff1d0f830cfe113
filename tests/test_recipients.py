"""Recipients are strings, Recipient objects or mappings; anything else is refused by position."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

import dispatch_async as da
from dispatch_async._recipients import BadChunkError, check_shape, chunked, to_wire


class TestAcceptedForms:
    def test_a_string_is_a_number_without_vars(self) -> None:
        assert to_wire(["+5511987654321"], 0) == [{"number": "+5511987654321", "vars": {}}]

    def test_a_recipient_keeps_its_vars(self) -> None:
        r = da.Recipient("+5511912345678", vars={"pixCode": "000201"})
        assert to_wire([r], 0) == [{"number": "+5511912345678", "vars": {"pixCode": "000201"}}]

    def test_a_mapping_in_wire_shape_is_sent_as_given(self) -> None:
        item = {"number": "+5511900000001", "vars": {"name": "Ana"}}
        assert to_wire([item], 0) == [item]

    def test_after_another_form_a_mapping_in_wire_shape_is_still_not_copied(self) -> None:
        # A million recipients in wire shape cost no copies, wherever they stand.
        item = {"number": "+5511900000002", "vars": {"name": "Ana"}}
        wire = to_wire(["+5511900000001", item], 0)
        assert wire[1] is item

    def test_a_recipients_vars_go_as_they_are_when_a_dict_else_as_a_dict(self) -> None:
        shared = da.Recipient("+5511900000001", vars={"name": "Ana"})
        other = da.Recipient("+5511900000002", vars=MappingProxyType({"name": "Bia"}))
        wire = to_wire([shared, other], 0)
        assert wire[0]["vars"] is shared.vars
        assert type(wire[1]["vars"]) is dict
        assert wire[1]["vars"] == {"name": "Bia"}

    def test_refs_hold_the_refs_given_and_no_other_position(self) -> None:
        refs: dict[int, Any] = {}
        to_wire([da.Recipient("1"), da.Recipient("2", ref="row 2"), "3"], 5, refs)
        assert refs == {6: "row 2"}

    def test_a_mapping_without_vars_gets_empty_vars(self) -> None:
        assert to_wire([{"number": "+5511900000001"}], 0) == [
            {"number": "+5511900000001", "vars": {}}
        ]

    def test_mixed_forms_keep_their_order(self) -> None:
        items: list[Any] = ["1", da.Recipient("2"), {"number": "3"}]
        assert [m["number"] for m in to_wire(items, 0)] == ["1", "2", "3"]

    def test_other_mappings_and_subclasses_are_read_like_their_plain_forms(self) -> None:
        class Number(str):
            pass

        class Contact(da.Recipient):
            pass

        items: list[Any] = [
            MappingProxyType({"number": "1", "vars": MappingProxyType({"a": "b", "c": "d"})}),
            MappingProxyType({"number": "2", "vars": None}),
            Number("3"),
            Contact("4", vars={"e": "f"}, ref="row 4"),
        ]
        refs: dict[int, Any] = {}
        wire = to_wire(items, 10, refs)
        assert wire == [
            {"number": "1", "vars": {"a": "b", "c": "d"}},
            {"number": "2", "vars": {}},
            {"number": "3", "vars": {}},
            {"number": "4", "vars": {"e": "f"}},
        ]
        assert all(type(m) is dict and type(m["vars"]) is dict for m in wire)
        assert type(wire[2]["number"]) is str
        assert refs == {13: "row 4"}


class TestRefusedForms:
    @pytest.mark.parametrize(
        ("item", "complaint"),
        [
            ("", "empty string"),
            (12345678, "not int"),
            (None, "not NoneType"),
            ({"vars": {}}, "'number' must be a non-empty string"),
            ({"number": 5511}, "'number' must be a non-empty string"),
            ({"number": ""}, "'number' must be a non-empty string"),
            ({"number": "1", "vars": {"a": 1}}, "vars['a'] must be a string, not int"),
            ({"number": "1", "vars": {1: "a"}}, "vars key 1 is not a string"),
            ({"number": "1", "vars": ["a"]}, "'vars' must be a mapping"),
            ({"number": "1", "name": "Ana"}, "unknown field(s) ['name']"),
        ],
    )
    def test_a_bad_recipient_is_named_by_its_position(self, item: Any, complaint: str) -> None:
        with pytest.raises(da.InvalidRecipientError) as caught:
            to_wire(["+5511900000001", "+5511900000002", item], 40)
        assert caught.value.position == 42
        assert "position 42" in str(caught.value)
        assert complaint in str(caught.value)

    @pytest.mark.parametrize(
        ("second", "complaint"),
        [
            ({"number": "2", "name": "Ana"}, "unknown field(s) ['name']"),
            ({"number": 2, "vars": {}}, "'number' must be a non-empty string"),
            ({"number": "2", "vars": ["a"]}, "'vars' must be a mapping"),
            ({"number": "2", "vars": {"a": 1}}, "vars['a'] must be a string, not int"),
        ],
    )
    def test_after_a_run_of_wire_messages_a_bad_one_is_named_by_its_position(
        self, second: dict[str, Any], complaint: str
    ) -> None:
        with pytest.raises(da.InvalidRecipientError) as caught:
            to_wire([{"number": "1", "vars": {}}, second], 0)
        assert caught.value.position == 1
        assert complaint in str(caught.value)

    @pytest.mark.parametrize(
        ("item", "problem"),
        [
            ("", "the number is an empty string"),
            ({"number": "1", "vars": ["a"]}, "'vars' must be a mapping, not list"),
            ({"number": "1", "vars": 5}, "'vars' must be a mapping, not int"),
        ],
    )
    def test_the_problem_is_told_exactly(self, item: Any, problem: str) -> None:
        with pytest.raises(da.InvalidRecipientError) as caught:
            to_wire([item], 0)
        assert caught.value.problem == problem

    @pytest.mark.parametrize(
        ("single", "kind"),
        [
            ("+5511900000001", "str"),
            (b"+5511900000001", "bytes"),
            ({"number": "+5511900000001"}, "dict"),
            (da.Recipient("+5511900000001"), "Recipient"),
        ],
    )
    def test_one_recipient_where_a_collection_belongs_is_refused_by_its_kind(
        self, single: object, kind: str
    ) -> None:
        with pytest.raises(da.InputError) as caught:
            check_shape(single)
        assert str(caught.value) == (
            f"recipients must be a collection of recipients, not a single {kind}"
        )

    def test_the_error_is_also_a_value_error_and_a_type_error(self) -> None:
        with pytest.raises(ValueError, match="position 0"):
            to_wire([3], 0)
        with pytest.raises(TypeError, match="position 0"):
            to_wire([3], 0)

    def test_a_recipient_refuses_a_bad_number_when_built(self) -> None:
        with pytest.raises(TypeError, match="non-empty string"):
            da.Recipient("")
        with pytest.raises(TypeError, match="strings to strings"):
            da.Recipient("1", vars={"a": 1})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match="vars must be a mapping of strings, not list"):
            da.Recipient("1", vars=[("a", "1")])  # type: ignore[arg-type]


class TestChunking:
    async def test_a_list_is_cut_into_chunks_of_the_given_size(self) -> None:
        chunks = [c async for c in chunked([str(i) for i in range(25)], 10)]
        assert [(c.start, c.size) for c in chunks] == [(0, 10), (10, 10), (20, 5)]

    async def test_a_list_in_wire_shape_is_sent_in_slices_of_the_callers_own_dicts(
        self,
    ) -> None:
        items = [{"number": str(i), "vars": {"row": str(i)}} for i in range(5)]
        chunks = [c async for c in chunked(items, 2)]
        sent = [m for c in chunks for m in c.messages]
        assert all(m is item for m, item in zip(sent, items, strict=True))

    async def test_a_bad_recipient_anywhere_in_a_list_raises_before_the_first_chunk(
        self,
    ) -> None:
        items = ["1"] * 99 + [None]
        with pytest.raises(da.InvalidRecipientError, match="position 99"):
            await anext(chunked(items, 10))

    async def test_an_iterator_is_read_one_chunk_at_a_time(self) -> None:
        read = []

        def numbers():  # type: ignore[no-untyped-def]
            for i in range(30):
                read.append(i)
                yield str(i)

        chunks = chunked(numbers(), 10)
        first = await anext(chunks)
        assert first.size == 10
        assert len(read) == 10
        await chunks.aclose()

    async def test_an_async_iterable_is_chunked_too(self) -> None:
        async def numbers():  # type: ignore[no-untyped-def]
            for i in range(12):
                yield str(i)

        chunks = [c async for c in chunked(numbers(), 5)]
        assert [c.size for c in chunks] == [5, 5, 2]
        assert chunks[2].messages[-1]["number"] == "11"

    async def test_a_bad_recipient_in_a_stream_keeps_the_recipients_read_before_it(
        self,
    ) -> None:
        class Contact(da.Recipient):
            pass

        # The second chunk: other forms than the plain ones before the bad recipient.
        items: list[Any] = [
            *map(str, range(4)),
            MappingProxyType({"number": "4"}),
            Contact("5", vars={"a": "b"}, ref="row 5"),
            None,
            "7",
        ]
        chunks = chunked(iter(items), 4)
        assert (await anext(chunks)).size == 4
        with pytest.raises(BadChunkError) as caught:
            await anext(chunks)
        assert caught.value.position == 6
        before = caught.value.before
        assert (before.start, before.size) == (4, 2)
        assert before.messages == [{"number": "4", "vars": {}}, {"number": "5", "vars": {"a": "b"}}]
        assert before.refs == {5: "row 5"}
