"""phonenumbers' metadata, compiled for ``dispatch_async._e164``'s replay of parse.

What parse and is_valid_number read from a region's PhoneMetadata, with the patterns
compiled once (and the kinds of number joined into one pattern per length) when a region
or calling code is first met. Anything unlike what the replay expects raises
``Unfamiliar``, and phonenumbers answers instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import attrs

from .patterns import first_digits

__all__ = [
    "OTHER",
    "POSSIBLE",
    "TOO_LONG",
    "Calling",
    "Home",
    "Region",
    "Tables",
    "Unfamiliar",
]

#: The phonenumbers releases whose steps ``_decide`` replays (the tests compare them).
KNOWN_MAJORS = ("8", "9")
#: phonenumbers' private limits, and the values ``_decide`` was written for.
LIMITS = {
    "_MAX_INPUT_STRING_LENGTH": 250,
    "_MIN_LENGTH_FOR_NSN": 2,
    "_MAX_LENGTH_FOR_NSN": 17,
    "_MAX_LENGTH_COUNTRY_CODE": 3,
}
#: The kinds of number is_valid_number accepts (_number_type_helper), mobile first.
KINDS = (
    "mobile",
    "fixed_line",
    "premium_rate",
    "toll_free",
    "shared_cost",
    "voip",
    "personal_number",
    "pager",
    "uan",
    "voicemail",
)
# What parse makes of _test_number_length's answer: keep a stripped national prefix
# (possible or too long) or not; and "too long" on its own for the country code check.
POSSIBLE, TOO_LONG, OTHER = 0, 1, 2


class Unfamiliar(Exception):
    """Metadata unlike what ``_decide`` replays (or none where parse expects some)."""


@attrs.frozen
class Region:
    """What parse and is_valid_number read from one PhoneMetadata, compiled."""

    country_code: int
    idd: re.Pattern[str] | None
    #: The first digits a match of idd, of national_prefix, can start with; None: any.
    idd_first: frozenset[str] | None
    prefix_first: frozenset[str] | None
    national_prefix: re.Pattern[str] | None
    #: national_prefix_transform_rule: None, or (digits, group) for "<digits>\\<group>",
    #: the only form in the metadata; any other goes through re's own template.
    transform: str | tuple[str, int] | None
    general: re.Pattern[str] | None
    general_first: frozenset[str] | None
    #: _test_number_length by length; longer than the tuple: too long.
    lengths: tuple[int, ...]
    leading_digits: re.Pattern[str] | None
    #: By length, one pattern that matches where _number_type_helper finds a type.
    typed: Typed

    def known_type(self, nsn: str) -> bool:
        pattern = self.typed[len(nsn)]
        return pattern is not None and pattern.fullmatch(nsn) is not None

    def length(self, number: str) -> int:
        size = len(number)
        return self.lengths[size] if size < len(self.lengths) else TOO_LONG

    def general_match(self, number: str) -> bool:
        """_match_national_number(number, general_desc)."""
        if self.general is None:
            return False
        first = self.general_first
        if first is not None and number[:1] not in first:
            return False
        return self.general.fullmatch(number) is not None

    def without_national_prefix(self, number: str, found: re.Match[str] | None) -> str:
        """The number _maybe_strip_national_prefix_carrier_code returns.

        *found* is ``national_prefix.match(number)``, which the caller has at hand.
        """
        if found is None or not number:
            return number
        transform = self.transform
        if transform is None or found.group(found.re.groups) is None:
            rest = number[found.end() :]
        elif type(transform) is tuple:
            # What re.sub(pattern, rule, number, count=1) makes of the match at 0.
            rest = transform[0] + (found.group(transform[1]) or "") + number[found.end() :]
        else:
            rest = found.re.sub(transform, number, count=1)  # type: ignore[arg-type]
        return number if self.general_match(number) and not self.general_match(rest) else rest

    def prefix_of(self, number: str) -> re.Match[str] | None:
        """national_prefix.match(number), skipped where its first digit rules it out."""
        if self.national_prefix is None:
            return None
        if self.prefix_first is not None and number[:1] not in self.prefix_first:
            return None
        return self.national_prefix.match(number)


@attrs.frozen(eq=False)
class Calling:
    """One country calling code: the metadata parse goes on with, and how it is judged.

    With several regions (1: the United States, Canada and 23 others), each region's
    metadata is compiled only once a number reaches it, as phonenumbers loads it.
    """

    country_code: int
    plus_code: str
    main: Region | None
    #: With one region, the metadata it is judged by, whatever the number.
    only: Region | None
    regions: Sequence[str]
    tables: Tables

    def judge(self, nsn: str) -> Region | None:
        """The region is_valid_number judges *nsn* by (_region_code_for_number_from_list)."""
        for code in self.regions:
            chooser = self.tables.region(code.upper())
            if chooser is None:
                continue
            if chooser.leading_digits is not None:
                if chooser.leading_digits.match(nsn):
                    return self.tables.judge(self.country_code, code)
            elif chooser.known_type(nsn):
                return self.tables.judge(self.country_code, code)
        return None


@attrs.frozen
class Home:
    """The region given for numbers without "+", with its own calling code."""

    region: Region
    calling: Calling
    code: str


class Tables:
    """phonenumbers and what was compiled from its metadata, filled on first use.

    Two threads may compile the same entry at once; both get equal values.
    """

    def __init__(self, phonenumbers: Any) -> None:
        self.pn = phonenumbers
        util = phonenumbers.phonenumberutil
        self.regions_of: dict[int, Sequence[str]] = util.COUNTRY_CODE_TO_REGION_CODE
        known = self.regions_of
        self.supported: set[str] = util.SUPPORTED_REGIONS
        self.non_geo: str = phonenumbers.REGION_CODE_FOR_NON_GEO_ENTITY
        major = str(getattr(phonenumbers, "__version__", "")).split(".")[0]
        limits = {name: getattr(util, name, None) for name in LIMITS}
        self.fast = major in KNOWN_MAJORS and limits == LIMITS
        self.homes: dict[str, Home] = {}
        self.callings: dict[int, Calling] = {}
        #: _extract_country_code by a number's first three digits: (code, its length).
        self.codes = {
            start: next((int(start[:n]), n) for n in (1, 2, 3) if int(start[:n]) in known)
            for start in map(str, range(100, 1000))
            if any(int(start[:n]) in known for n in (1, 2, 3))
        }
        self._regions: dict[tuple[str, int], Region | None] = {}

    def home(self, code: str) -> Home | None:
        """metadata_for_region(code), for a number read without its country code."""
        region = self.region(code)
        if region is None:
            return None
        found = Home(region, self.calling(region.country_code), str(region.country_code))
        return self.homes.setdefault(code, found)

    def calling(self, country_code: int) -> Calling:
        found = self.callings.get(country_code)
        if found is None:
            codes = self.regions_of.get(country_code, ())
            found = Calling(
                country_code=country_code,
                plus_code=f"+{country_code}",
                main=self._for(country_code, codes[0]) if codes else None,
                only=self.judge(country_code, codes[0]) if len(codes) == 1 else None,
                regions=codes,
                tables=self,
            )
            found = self.callings.setdefault(country_code, found)
        return found

    def region(self, code: str) -> Region | None:
        """metadata_for_region(code), compiled."""
        return self._metadata(code, 0)

    def _for(self, country_code: int, code: str) -> Region | None:
        """metadata_for_region_or_calling_code."""
        return self._metadata(code, country_code if code == self.non_geo else 0)

    def judge(self, country_code: int, code: str) -> Region | None:
        """What is_valid_number_for_region judges by: None where it answers False."""
        region = self._for(country_code, code.upper())
        if region is None or (code != self.non_geo and region.country_code != country_code):
            return None  # is_valid_number_for_region is False whatever the number
        return region

    def _metadata(self, code: str, non_geo: int) -> Region | None:
        """One region's (or with *non_geo*, that calling code's) compiled metadata."""
        key = (code, non_geo)
        if key not in self._regions:
            lookup = self.pn.PhoneMetadata
            if non_geo:
                metadata = lookup.metadata_for_nongeo_region(non_geo, None)
            else:
                metadata = lookup.metadata_for_region(code, None)
            self._regions.setdefault(key, None if metadata is None else compile_region(metadata))
        return self._regions[key]


def compile_region(md: Any) -> Region:
    try:
        general = md.general_desc
        parsing = md.national_prefix_for_parsing
        national_prefix = _compiled(parsing) if parsing else None
        rule = md.national_prefix_transform_rule or None
        if not general.possible_length or (
            rule and (national_prefix is None or not national_prefix.groups)
        ):
            raise ValueError("parse raises an IndexError there: phonenumbers shows it")
        general_pattern = _pattern(general)
        simple = re.fullmatch(r"(\d*)\\([1-9])", rule or "")
        transform: str | tuple[str, int] | None = rule
        if simple is not None and national_prefix is not None:
            if int(simple[2]) > national_prefix.groups:
                raise ValueError("parse raises re.error there: phonenumbers shows it")
            transform = (simple[1], int(simple[2]))
        return Region(
            country_code=md.country_code,
            idd=_compiled(md.international_prefix) if md.international_prefix else None,
            idd_first=first_digits(md.international_prefix or ""),
            prefix_first=first_digits(parsing or ""),
            national_prefix=national_prefix,
            transform=transform,
            general=general_pattern,
            general_first=first_digits(general.national_number_pattern or ""),
            lengths=_lengths(general.possible_length, general.possible_length_local_only),
            leading_digits=None if md.leading_digits is None else _compiled(md.leading_digits),
            typed=Typed(_descriptions(md), general_pattern),
        )
    except Exception as exc:
        raise Unfamiliar from exc


def _compiled(pattern: str) -> re.Pattern[str]:
    """A metadata pattern, for ASCII digits only: the replay gives it nothing else.

    On ASCII digits, ``re.ASCII`` changes no answer (``\\d`` is 0-9 either way) and the
    matching is about a fifth quicker.
    """
    return re.compile(pattern, re.ASCII)


def _pattern(desc: Any) -> re.Pattern[str] | None:
    """_match_national_number's pattern: None where it never matches."""
    if desc is None or not desc.national_number_pattern:
        return None
    return _compiled(desc.national_number_pattern)


def _lengths(possible: Sequence[int], local: Sequence[int]) -> tuple[int, ...]:
    """_test_number_length(number, metadata) for every length up to the longest."""
    answers = []
    for size in range(max([*possible, *local]) + 1):
        if size in local:
            answers.append(OTHER)
        elif possible[0] == size:
            answers.append(POSSIBLE)
        elif possible[0] > size:
            answers.append(OTHER)
        elif possible[-1] < size:
            answers.append(TOO_LONG)
        else:
            answers.append(POSSIBLE if size in possible[1:] else OTHER)
    return tuple(answers)


def _descriptions(md: Any) -> tuple[tuple[str, frozenset[int]], ...]:
    """general_desc, then the kinds _number_type_helper tries (those that can match)."""
    general = md.general_desc
    if not general.national_number_pattern:
        raise ValueError("no general pattern: nothing is valid")
    kinds = [getattr(md, kind) for kind in KINDS]
    if md.same_mobile_and_fixed_line_pattern:
        kinds = kinds[1:]  # then _number_type_helper never tries mobile on its own
    return tuple(
        (desc.national_number_pattern, frozenset(desc.possible_length))
        for desc in (general, *kinds)
        if desc is not None and desc.national_number_pattern
    )


#: Numbers of one length a region checks kind by kind before joining the kinds into one
#: pattern: joining costs milliseconds to compile and saves about half a microsecond a
#: number, so a length met only now and then is never worth it.
_JOIN_AFTER = 1000


class Typed(dict[int, "Matcher | None"]):
    """By length, what matches where general_desc and one of the kinds match.

    _number_type_helper walks through the kinds, whose order cannot change whether one of
    them matches; a description's lengths, where it has any, decide whether it takes
    part. None: no number of that length has a type.
    """

    def __init__(
        self,
        descriptions: tuple[tuple[str, frozenset[int]], ...],
        general: re.Pattern[str] | None,
    ) -> None:
        super().__init__()
        self.descriptions = descriptions
        #: Each description's pattern, compiled the first time a number needs it.
        self.compiled = {general.pattern: general} if general is not None else {}

    def __missing__(self, size: int) -> Matcher | None:
        (general, lengths), *kinds = self.descriptions
        fitting = [pattern for pattern, sizes in kinds if _fits(sizes, size)]
        walk = _Walk(self, size, general, fitting) if fitting and _fits(lengths, size) else None
        return self.setdefault(size, walk)

    def pattern(self, source: str) -> re.Pattern[str]:
        found = self.compiled.get(source)
        if found is None:
            found = self.compiled.setdefault(source, _compiled(source))
        return found

    def join(self, size: int) -> None:
        """One pattern for the lengths' kinds, quicker to match than trying them in turn.

        The patterns have no groups (checked), so joining them changes none of them.
        """
        (general, _), *kinds = self.descriptions
        either = "|".join(f"(?:{pattern})" for pattern, sizes in kinds if _fits(sizes, size))
        try:
            joined = _compiled(rf"(?=(?:{general})\Z)(?:{either})")
        except re.error as exc:
            raise Unfamiliar from exc
        if joined.groups:  # joining would renumber them: never so far
            raise Unfamiliar
        self[size] = joined


class _Walk:
    """general_desc, then each kind in turn, for numbers of one length; joined when used.

    A pattern is compiled when a number first needs it: a region met with a few wrong
    numbers costs the general pattern only.
    """

    __slots__ = ("general", "kinds", "size", "typed", "uses")

    def __init__(self, typed: Typed, size: int, general: str, kinds: list[str]) -> None:
        self.typed, self.size, self.general, self.kinds = typed, size, general, kinds
        self.uses = 0

    def fullmatch(self, nsn: str) -> object:
        self.uses += 1
        if self.uses == _JOIN_AFTER:
            self.typed.join(self.size)
        pattern = self.typed.pattern
        if pattern(self.general).fullmatch(nsn) is None:
            return None
        return next((True for kind in self.kinds if pattern(kind).fullmatch(nsn) is not None), None)


Matcher = re.Pattern[str] | _Walk


def _fits(lengths: frozenset[int], size: int) -> bool:
    return not lengths or size in lengths
