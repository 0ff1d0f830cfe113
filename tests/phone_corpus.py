"""Phone numbers as spreadsheets hold them, generated from a seed.

Used by tests/test_e164.py (to_e164 against ``by_phonenumbers``, phonenumbers' own
answer) and by benchmarks/e164.py (the same corpus and reference, timed). Brazilian
numbers in every format people type them in: local mobile and landline, with or without
+55 or 55, a trunk 0 and a carrier code, with any separators, plus the typos and junk
real columns have; foreign numbers from phonenumbers' own examples for every region,
their digits varied.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

import phonenumbers

FULLWIDTH = {ord(digit): ord(digit) + 0xFEE0 for digit in "0123456789"}
#: Brazil's area codes (DDD) in use, and some that are not.
# fmt: off
AREAS = tuple(map(str, (
    11, 12, 13, 14, 15, 16, 17, 18, 19, 21, 22, 24, 27, 28, 31, 32, 33, 34, 35, 37, 38, 41,
    42, 43, 44, 45, 46, 47, 48, 49, 51, 53, 54, 55, 61, 62, 63, 64, 65, 66, 67, 68, 69, 71,
    73, 74, 75, 77, 79, 81, 82, 83, 84, 85, 86, 87, 88, 89, 91, 92, 93, 94, 95, 96, 97, 98,
    99,
)))
UNUSED_AREAS = ("00", "01", "09", "10", "20", "23", "25", "26", "29", "30", "36", "39", "40")
UNUSED_AREAS += ("50", "52", "56", "57", "58", "59", "60", "70", "72", "76", "78", "80", "90")
#: Carrier selection codes (two digits after the trunk 0), real ones and others.
CARRIERS = ("12", "14", "15", "21", "23", "25", "31", "41", "43", "55", "65", "99", "10")
CARRIERS += ("17", "22", "33", "77")
# fmt: on
SEPARATORS = (" ", "-", "", ".", "/", "\u00a0", " - ")
#: Regions a corpus entry may be read in, the odd ones included.
REGIONS = ("BR", "BR", "BR", "BR", None, "US", "AR", "MX", "GB", "PT", "br", "ZZ", "001", "")
JUNK = (
    "",
    " ",
    "-",
    "0",
    "n/a",
    "N/D",
    "#N/D",
    "sem telefone",
    "não tem",
    "(11)",
    "+55",
    "55",
    "tel: (11) 98765-4321",
    "11 98765-4321 / 11 3456-7890",
    "11 98765-4321 ramal 12",
    "5.51199E+12",
    "5,51198765432E+12",
    "0XX11 98765-4321",
    "0 XX 11 98765-4321",
    "(11) 98765-4321 x12",
    "+55 (11) 9 8765-4321;ext=2",
    "tel:+55-11-98765-4321",
    "11 98765-4321".translate(FULLWIDTH),
    "(11)\t98765-4321",
    "+5511987654321\n",
    "++55 11 98765-4321",
    "+ 55 11 98765-4321",
    "11 98765-4321 -",
)


def by_phonenumbers(number: str, region: str | None) -> str | None:
    """phonenumbers' own answer: parse, is_valid_number, format_number(E164)."""
    try:
        parsed = phonenumbers.parse(number, region)
    except phonenumbers.NumberParseException:
        return None
    if not phonenumbers.is_valid_number(parsed):
        return None
    return str(phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164))


def digits(rng: random.Random, count: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(count))


def subscriber(rng: random.Random) -> str:
    """A mobile (9 + 8 digits), a landline (2-5 + 7), an old 8-digit mobile, or a typo."""
    kind = rng.random()
    if kind < 0.55:
        number = "9" + digits(rng, 8)
    elif kind < 0.85:
        number = rng.choice("2345") + digits(rng, 7)
    elif kind < 0.9:
        number = rng.choice("6789") + digits(rng, 7)
    else:
        number = digits(rng, rng.choice((7, 8, 9, 10)))
    return number


def brazilian(rng: random.Random) -> str:
    """One Brazilian number as a spreadsheet holds it."""
    area = rng.choice(AREAS) if rng.random() < 0.95 else rng.choice(UNUSED_AREAS)
    number = subscriber(rng)
    sep = rng.choice(SEPARATORS) if rng.random() < 0.4 else rng.choice((" ", "-"))
    split = max(len(number) - 4, 1)
    body = number if rng.random() < 0.25 else number[:split] + sep + number[split:]
    shown_area = f"({area})" if rng.random() < 0.5 else area
    gap = rng.choice((" ", "", " ", "-", "\u00a0"))
    [make_prefix] = rng.choices([m for _, m in PREFIXES], [w for w, _ in PREFIXES])
    prefix = make_prefix(rng)
    if prefix.endswith("("):
        shown_area = area + ")"
    text = f"{prefix}{shown_area}{gap}{body}"
    if rng.random() < 0.05:
        text = rng.choice((" ", "\t", "  ")) + text + rng.choice((" ", "\n", "\r\n", ""))
    return text


def _carrier(rng: random.Random) -> str:
    code = rng.choice(CARRIERS)
    return rng.choice((f"0 {code} ", f"0{code}", f"0{code} ", f"0 {code}"))


#: What comes before the area code, and how often: a guess at a Brazilian company's
#: column, mostly plain local numbers and +55, every other form people write rarer.
PREFIXES: tuple[tuple[int, Callable[[random.Random], str]], ...] = (
    (40, lambda rng: ""),
    (10, lambda rng: "+55 "),
    (6, lambda rng: "+55"),
    (3, lambda rng: "(+55) "),
    (3, lambda rng: "+55 ("),
    (6, lambda rng: "55 "),
    (6, lambda rng: "55"),
    (4, lambda rng: "0"),
    (4, lambda rng: "0 "),
    (2, lambda rng: "(0"),
    (2, lambda rng: "+55 0"),
    (2, lambda rng: "55 0"),
    (2, lambda rng: "0055 "),
    (2, lambda rng: f"00 {rng.choice(CARRIERS)} 55 "),
    (4, _carrier),
)


#: Where a Brazilian company's foreign customers mostly live.
NEIGHBOURS = ("US", "PT", "AR", "PY", "UY", "CL", "ES", "IT", "DE", "FR", "GB", "JP", "CA")
NEIGHBOURS += ("MX", "CO", "PE", "BO", "CN", "AO", "MZ")


@functools.cache
def _examples(regions: tuple[str, ...] | None = None) -> tuple[tuple[int, str], ...]:
    """(country code, national number) of phonenumbers' examples of every kind.

    For *regions*, or every region and non-geographic code.
    """
    found = set()
    kinds = (phonenumbers.PhoneNumberType.MOBILE, phonenumbers.PhoneNumberType.FIXED_LINE)
    kinds += (phonenumbers.PhoneNumberType.TOLL_FREE, phonenumbers.PhoneNumberType.VOIP)
    for region in regions or sorted(phonenumbers.SUPPORTED_REGIONS):
        for kind in kinds:
            example = phonenumbers.example_number_for_type(region, kind)
            if example is not None:
                found.add((example.country_code, phonenumbers.national_significant_number(example)))
    for code in () if regions else sorted(phonenumbers.COUNTRY_CODES_FOR_NON_GEO_REGIONS):
        example = phonenumbers.example_number_for_non_geo_entity(code)
        if example is not None:
            found.add((code, phonenumbers.national_significant_number(example)))
    return tuple(sorted(found))


def foreign(rng: random.Random, regions: tuple[str, ...] | None = None) -> str:
    """A number from anywhere (or *regions*), its last digits varied, in international form."""
    code, national = rng.choice(_examples(regions))
    keep = rng.randint(max(len(national) - 5, 1), len(national))
    national = national[:keep] + digits(rng, len(national) - keep + rng.choice((0, 0, 0, 1, -1)))
    if rng.random() < 0.6:
        return f"+{code}{national}"
    cut = rng.randint(1, max(len(national) - 1, 1))
    return f"+{code} {national[:cut]} {national[cut:]}".rstrip()


def invalid(rng: random.Random) -> str:
    """What a phone column holds when it holds no phone number."""
    kind = rng.random()
    if kind < 0.4:
        return rng.choice(JUNK)
    if kind < 0.7:
        return digits(rng, rng.randint(1, 20))
    if kind < 0.85:
        return f"+{digits(rng, rng.randint(1, 16))}"
    return rng.choice(AREAS) + " " + digits(rng, rng.choice((5, 6, 7, 10, 11)))


def arbitrary(rng: random.Random) -> str:
    """Characters phonenumbers gives a meaning to, in any order."""
    # Also an Arabic-Indic three, a full-width one and a full-width A.
    alphabet = "0123456789" * 3 + "+ -().//\u00a0\txX#;,*eE~Ext=" + "\u0663\uff11\uff21abcTEL:"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 22)))


def spreadsheet_mix(rng: random.Random) -> str:
    """A Brazilian company's phone column: mostly local numbers, some foreign, some junk."""
    kind = rng.random()
    if kind < 0.9:
        return brazilian(rng)
    return foreign(rng, NEIGHBOURS) if kind < 0.95 else invalid(rng)


def corpus(
    size: int, seed: int, make: Callable[[random.Random], str] = spreadsheet_mix
) -> list[str]:
    rng = random.Random(seed)
    return [make(rng) for _ in range(size)]
