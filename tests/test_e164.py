"""``to_e164`` answers exactly what phonenumbers answers, faster for spreadsheet numbers.

The reference is phonenumbers' own parse + is_valid_number + format_number(E164), called
here; every answer of the SDK is compared with it: a fixed, seeded corpus of spreadsheet
numbers, phonenumbers' examples for every region in every form, and hypothesis.
"""

from __future__ import annotations

import random
import re
import string

import phonenumbers
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dispatch_async as da
from dispatch_async import _e164
from dispatch_async._e164 import metadata
from dispatch_async._e164.patterns import first_digits

from . import phone_corpus
from .phone_corpus import by_phonenumbers as reference


@pytest.fixture(autouse=True)
def compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """phonenumbers keeps its compiled patterns (the same answers, sooner) during a test.

    Numbers from many regions overflow the re module's cache, and phonenumbers then
    compiles its patterns again for every number. Where the release has no such cache,
    nothing changes.
    """
    monkeypatch.setattr(phonenumbers.re_util, "_COMPILED_PATTERNS", {}, raising=False)


def differences(pairs: list[tuple[str, str | None]]) -> list[tuple[str, str | None, object]]:
    """(number, region, (SDK's answer, phonenumbers')) wherever they differ."""
    found = []
    for number, region in pairs:
        ours, theirs = da.to_e164(number, region), reference(number, region)
        if ours != theirs:
            found.append((number, region, (ours, theirs)))
    return found


def decided(number: str, region: str | None) -> bool:
    """Whether the fast path answered, rather than handing the number to phonenumbers."""
    return _e164._decide(_e164._load(), number, region) is not _e164._UNSURE


class TestTheSameAnswersAsPhonenumbers:
    def test_on_a_fixed_corpus_of_spreadsheet_numbers(self) -> None:
        rng = random.Random(164)
        makers = [phone_corpus.spreadsheet_mix] * 6
        makers += [phone_corpus.brazilian, phone_corpus.foreign, phone_corpus.invalid]
        makers += [phone_corpus.arbitrary]
        regions = ["BR"] * 20 + list(phone_corpus.REGIONS)
        pairs = [(rng.choice(makers)(rng), rng.choice(regions)) for _ in range(100_000)]
        assert len(set(pairs)) > 90_000
        assert differences(pairs) == []

    def test_on_every_regions_examples_in_every_form(self) -> None:
        pairs: list[tuple[str, str | None]] = []
        forms = [phonenumbers.PhoneNumberFormat.NATIONAL, phonenumbers.PhoneNumberFormat.E164]
        forms += [phonenumbers.PhoneNumberFormat.INTERNATIONAL]
        for region in sorted(phonenumbers.SUPPORTED_REGIONS):
            for kind in sorted(phonenumbers.supported_types_for_region(region)):
                example = phonenumbers.example_number_for_type(region, kind)
                if example is None:
                    continue
                for form in forms:
                    written = phonenumbers.format_number(example, form)
                    pairs += [(written, region), (written, "BR"), (written, None)]
                carrier = phonenumbers.format_national_number_with_carrier_code(example, "15")
                pairs += [(carrier, region), (written[:-1], region), (written + "0", region)]
        assert len(pairs) > 10_000
        assert differences(pairs) == []

    @pytest.mark.parametrize(
        "number",
        [
            "(11) 98765-4321",
            "11 3456-7890",
            "+55 11 98765-4321",
            "55 11 98765 4321",
            "0 15 11 98765-4321",
            "015 11 3456 7890",
            "(011) 98765-4321",
            "0055 11 98765-4321",
            "00 21 1 650 253 0000",
            "+1 650 253 0000",
            "+44 20 7946 0958",
            "+351 912 345 678",
            "",
            "sem telefone",
            "9876-5432",
            "0XX11 98765-4321",
            "(0xx21) 3456-7890",
            "11 98765-4321 x12",
            "11 98765-4321/x12",
        ],
    )
    @pytest.mark.parametrize("region", ["BR", None, "br", "US"])
    def test_on_the_forms_people_write(self, number: str, region: str | None) -> None:
        assert da.to_e164(number, region) == reference(number, region)


#: Hypothesis: Brazilian numbers assembled from the parts people write them with.
brazilian_numbers = st.builds(
    "{}{}{}{}{}{}{}".format,
    st.sampled_from(["", "", " ", "\t", "("]),
    st.sampled_from(["", "+55", "55", "+55 ", "55 ", "0", "0 ", "+55 0", "0055", "(+55) "]),
    st.one_of(
        st.just(""),
        st.sampled_from(phone_corpus.CARRIERS).map("0{} ".format),
        st.sampled_from(["0 ", "0XX", "0 XX ", "0xx", "x", "0XXX"]),
    ),
    st.tuples(
        st.one_of(st.sampled_from(phone_corpus.AREAS), st.text("0123456789", max_size=3)),
        st.booleans(),
    ).map(lambda area: f"({area[0]})" if area[1] else area[0]),
    st.sampled_from(["", " ", "-", ") ", ".", "\u00a0"]),
    st.text("0123456789", min_size=0, max_size=11),
    st.sampled_from(["", "-1234", " 4321", ".0000", " ", "\n", ")", " x12", "x1", "/x2", " X 3."]),
)
foreign_numbers = st.builds(
    "{}{}{}".format,
    st.sampled_from(["+", "+ ", "00", "+0", "++", "(+"]),
    st.sampled_from(sorted(phonenumbers.COUNTRY_CODE_TO_REGION_CODE)).map(str),
    st.text("0123456789 -()", max_size=16),
)
#: Also an Arabic-Indic three, a full-width one, plus and A.
phone_alphabet = string.digits * 2 + "+ -().//\u00a0\t\nxX#;,*~eE=:" + "\u0663\uff11\uff0b\uff21tel"
regions = st.sampled_from(
    ["BR", None, "US", "AR", "MX", "GB", "IT", "CA", "RU", "br", "ZZ", "001", ""]
)


class TestHypothesis:
    @settings(max_examples=800, deadline=None)
    @given(brazilian_numbers, regions)
    def test_brazilian_numbers(self, number: str, region: str | None) -> None:
        assert da.to_e164(number, region) == reference(number, region)

    @settings(max_examples=500, deadline=None)
    @given(foreign_numbers, regions)
    def test_foreign_numbers(self, number: str, region: str | None) -> None:
        assert da.to_e164(number, region) == reference(number, region)

    @settings(max_examples=500, deadline=None)
    @given(st.one_of(st.text(phone_alphabet, max_size=30), st.text(max_size=30)), regions)
    def test_any_text(self, number: str, region: str | None) -> None:
        assert da.to_e164(number, region) == reference(number, region)


class TestTheFastPathDecidesSpreadsheetNumbers:
    """Without this the speed would be phonenumbers': these never reach it."""

    def test_brazilian_formats_and_foreign_e164_are_decided_without_phonenumbers(self) -> None:
        rng = random.Random(55)
        numbers = [phone_corpus.brazilian(rng) for _ in range(2000)]
        numbers += [phone_corpus.foreign(rng) for _ in range(500)]
        plain = [n for n in numbers if n.isascii() or "\u00a0" in n]
        assert [n for n in plain if not decided(n, "BR")] == []

    def test_the_carrier_placeholder_of_old_lists_is_decided(self) -> None:
        for written in ["0XX11 98765-4321", "0 xx 21 3456-7890", "(0XX11) 98765-4321"]:
            assert decided(written, "BR")

    def test_empty_cells_and_text_without_digits_are_decided(self) -> None:
        for junk in ["", " ", "-", "n/a", "sem telefone", "+", "não tem"]:
            assert decided(junk, "BR")
            assert da.to_e164(junk, "BR") is None

    def test_a_pattern_is_skipped_only_where_it_cannot_match(self) -> None:
        """The first digits read off a prefix pattern rule out only numbers it never takes."""
        rng = random.Random(7)
        metadata = phonenumbers.PhoneMetadata
        regions = [metadata.metadata_for_region(r) for r in sorted(phonenumbers.SUPPORTED_REGIONS)]
        read = 0
        for md in regions:
            for source in (md.international_prefix, md.national_prefix_for_parsing):
                first = first_digits(source or "")
                if first is None:
                    continue
                read += 1
                pattern = re.compile(source)
                for digit in set(string.digits) - first:
                    for _ in range(30):
                        number = digit + phone_corpus.digits(rng, rng.randint(0, 14))
                        assert pattern.match(number) is None, (md.id, source, number)
        assert read > 300

    @pytest.mark.parametrize("pattern", ["[12", "1|[2", "(1", "(?:1|2", ""])
    def test_a_pattern_it_cannot_read_whole_gives_no_shortcut(self, pattern: str) -> None:
        assert first_digits(pattern) is None

    def test_a_length_met_often_is_judged_by_one_joined_pattern_with_the_same_answers(
        self,
    ) -> None:
        tables = metadata.Tables(phonenumbers)  # its own: joining here changes no other test
        rng = random.Random(11)
        compared = valid = 0
        for code in sorted(phonenumbers.SUPPORTED_REGIONS):
            region = tables.region(code)
            assert region is not None
            examples = [
                phonenumbers.national_significant_number(example)
                for kind in phonenumbers.supported_types_for_region(code)
                if (example := phonenumbers.example_number_for_type(code, kind)) is not None
            ]
            for size in set(map(len, examples)):
                walk = region.typed[size]
                if walk is None:
                    continue
                numbers = [phone_corpus.digits(rng, size) for _ in range(20)]
                for example in [e for e in examples if len(e) == size] * 5:
                    numbers.append(example[: size - 3] + phone_corpus.digits(rng, 3))
                answers = [walk.fullmatch(n) is not None for n in numbers]
                valid += sum(answers)
                region.typed.join(size)
                joined = region.typed[size]
                assert joined is not walk
                assert [joined.fullmatch(n) is not None for n in numbers] == answers, code
                compared += 1
        assert compared > 300
        assert valid > 1000
