"""Phone numbers in E.164: phonenumbers' own answer, computed faster for spreadsheet shapes.

``to_e164`` answers exactly what phonenumbers' ``parse`` + ``is_valid_number`` +
``format_number(E164)`` answers, for every input and region. That costs about 67 us a
number, mostly parsing, and a spreadsheet's numbers are ASCII digits with a few
separators and maybe one leading ``+``. For those, ``_decide`` replays the steps of
``parse`` and ``is_valid_number`` that can act on them, on phonenumbers' own metadata
compiled once per region and calling code. Anything else (letters, other characters,
fewer than three digits, a ``+`` that parse would retry without, metadata or a
phonenumbers release unlike what is replayed here) goes to phonenumbers itself.
tests/test_e164.py compares the two on generated, random and arbitrary input.
"""

from __future__ import annotations

import re
import threading

from .._exceptions import ConfigurationError
from .metadata import OTHER, TOO_LONG, Calling, Region, Tables, Unfamiliar

__all__ = ["to_e164"]

#: Separators that phonenumbers drops from a number's digits and that have no other role
#: there (they start no extension, no second number, no RFC 3966 part); and the no-break
#: space, which it treats as a space.
_SEPARATORS = b" -()./"
_NO_BREAK_SPACE = "\u00a0"
#: phonenumbers' ``\d``: any Unicode decimal digit. Without one, nothing is a number.
_ANY_DIGIT = re.compile(r"\d").search
_UNSURE = ""  # never an answer: every E.164 number starts with "+"
_NO_CODE = "?"  # nor this: no country code after a "+"


_tables: Tables | None = None
_tables_lock = threading.Lock()


def _load() -> Tables:
    global _tables
    with _tables_lock:
        if _tables is None:
            try:
                import phonenumbers
            except ImportError:  # pragma: no cover - depends on the installed extras
                raise ConfigurationError(
                    "checking phone numbers needs the phonenumbers extra: "
                    'pip install "dispatch-async[phonenumbers]"'
                ) from None
            _tables = Tables(phonenumbers)
        return _tables


def to_e164(number: str, region: str | None = None) -> str | None:
    """*number* in E.164 (``+5511987654321``) if it is a valid phone number, else None.

    *region* (``"BR"``) is the country assumed for a number written without ``+``. This is
    what ``prevalidate`` sends, and what ``dedupe`` compares with it; it needs the
    ``phonenumbers`` extra, and answers exactly what phonenumbers' parse,
    is_valid_number and E164 format answer.
    """
    tables = _tables or _load()
    if tables.fast:
        try:
            answer = _decide(tables, number, region)
        except Unfamiliar:
            answer = _UNSURE
        if answer is not _UNSURE:
            return answer
    pn = tables.pn
    try:
        parsed = pn.parse(number, region)
    except pn.NumberParseException:
        return None
    if not pn.is_valid_number(parsed):
        return None
    return str(pn.format_number(parsed, pn.PhoneNumberFormat.E164))


def _decide(tables: Tables, number: str, region: str | None) -> str | None:
    """phonenumbers' answer for the shapes spreadsheets hold; ``_UNSURE`` for the rest.

    parse's steps up to the national number are all here, and the end in ``_rest``: on
    this path a function call costs as much as a step of the replay.
    """
    if type(number) is not str or (region is not None and type(region) is not str):
        return _UNSURE
    if len(number) > 250:
        return None  # too long to parse
    if number.isascii():
        raw = number.encode()
    else:
        text = number.replace(_NO_BREAK_SPACE, " ")
        if not text.isascii():
            return None if _ANY_DIGIT(number) is None else _UNSURE
        raw = text.encode()
    # Whitespace before a number's first digit or after its last is dropped by parse.
    raw = raw.strip().translate(None, _SEPARATORS)
    plus = raw[:1] == b"+"
    if plus:
        raw = raw[1:]
    if not raw.isdigit():
        # Nothing but separators, or no decimal digit at all: never a viable number.
        return None if not raw or _ANY_DIGIT(number) is None else _UNSURE
    digits = raw.decode()
    if len(digits) < 3 and (plus or len(digits) < 2 or digits not in number):
        return None  # not viable: two digits written together, or three after a "+"
    if plus:
        if region == tables.non_geo:
            return _UNSURE
        answer = _international(tables, digits, _NO_CODE)
        if answer is not _NO_CODE:
            return answer
        # parse tries again without the "+", in the region given; only the international
        # prefix or the region's own country code can then give the number one.
        home = None if region is None else tables.home(region.upper())
        if home is None:
            return None
    else:
        home = tables.homes.get(region)  # type: ignore[arg-type]
        if home is None:
            if region not in tables.supported:
                return None  # no country to read a national number in
            home = tables.home(region)
            if home is None:
                return _UNSURE  # parse fails on None there
    # _maybe_extract_country_code, for a number without "+".
    metadata = home.region
    first = metadata.idd_first
    if metadata.idd is not None and (first is None or digits[:1] in first):
        found = metadata.idd.match(digits)
        if found is not None and not digits.startswith("0", found.end()):
            rest = digits[found.end() :]
            return None if len(rest) <= 2 else _international(tables, rest, None)
    if digits.startswith(home.code):
        national = digits[len(home.code) :]
        found = metadata.prefix_of(national)
        national = metadata.without_national_prefix(national, found)
        if metadata.length(digits) == TOO_LONG or (
            not metadata.general_match(digits) and metadata.general_match(national)
        ):
            main = home.calling.main
            if main is None:
                return _UNSURE  # parse asserts there
            # Stripped once here, and again at the end of parse: the same match, if none.
            return _rest(home.calling, main, national, found is not None or main is not metadata)
    return None if plus else _rest(home.calling, metadata, digits)


def _international(tables: Tables, digits: str, unknown: str | None) -> str | None:
    """The number after a "+" or an international prefix: *unknown* without a country code.

    *digits* has three or more (no country code starts with 0: none is listed for it).
    """
    found = tables.codes.get(digits[:3])
    if found is None:
        return unknown
    country_code, size = found
    calling = tables.callings.get(country_code) or tables.calling(country_code)
    if calling.main is None:
        return _UNSURE  # parse asserts there
    return _rest(calling, calling.main, digits[size:])


def _rest(calling: Calling, metadata: Region, national: str, prefixed: bool = True) -> str | None:
    """The end of parse (national prefix, lengths), then is_valid_number and E164.

    *prefixed* False: metadata's national prefix is known not to start *national*.
    """
    if len(national) < 2:
        return None
    prefix, first = metadata.national_prefix, metadata.prefix_first
    if prefix is not None and prefixed and (first is None or national[:1] in first):
        found = prefix.match(national)
        if found is not None:
            stripped = metadata.without_national_prefix(national, found)
            lengths = metadata.lengths  # metadata.length(stripped), without the call
            if len(stripped) >= len(lengths) or lengths[len(stripped)] != OTHER:
                national = stripped
    if len(national) > 17:
        return None
    # is_valid_number, then format_number(E164): the national significant number is
    # the string itself (parse counts its leading zeros).
    judge = calling.only if calling.only is not None else calling.judge(national)
    if judge is None:
        return None
    pattern = judge.typed[len(national)]  # judge.known_type, without the call
    if pattern is None or pattern.fullmatch(national) is None:
        return None
    return calling.plus_code + national
