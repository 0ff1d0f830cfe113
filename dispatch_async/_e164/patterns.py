"""Which digits a match of a metadata pattern can start with, read off the pattern.

A shortcut for the replay in ``dispatch_async._e164``: a national prefix that can only
start with 0 need not be tried on a number that starts with 1. Only plain patterns are
read; anything else gives None, and the pattern is then always tried.
"""

from __future__ import annotations

import re

__all__ = ["first_digits"]


def first_digits(pattern: str) -> frozenset[str] | None:
    """The characters a match of *pattern* can start with: where it is plain to read.

    Read are alternatives, groups ``(...)``/``(?:...)``, digits and digit classes
    ``[1-9]``, and a first atom that may repeat zero times makes the answer None; so
    does anything else (an escape, an anchor, a lookaround). None: no shortcut.
    """
    try:
        first, end = _alternatives(pattern, 0)
    except (IndexError, ValueError):  # unbalanced: a "(" or "[" not closed
        return None
    return first if end == len(pattern) else None


def _alternatives(pattern: str, at: int) -> tuple[frozenset[str] | None, int]:
    """The union over the alternatives from *at* to the ")" or end that closes them."""
    found: set[str] = set()
    while True:
        first, at = _atom(pattern, at)
        if pattern[at : at + 1] in ("?", "*") or pattern[at : at + 2] in ("{0", "{,"):
            first = None  # the atom may be skipped: what follows could come first
        at = _alternative_end(pattern, at)
        if first is None:
            return None, _group_end(pattern, at)
        found |= first
        if pattern[at : at + 1] != "|":
            return frozenset(found), at
        at += 1


def _atom(pattern: str, at: int) -> tuple[frozenset[str] | None, int]:
    char = pattern[at : at + 1]
    if char.isdigit() and char.isascii():
        return frozenset(char), at + 1
    if char == "[":
        end = pattern.index("]", at)
        members = pattern[at + 1 : end]
        if not members or not re.fullmatch(r"(?:\d(?:-\d)?)+", members):
            return None, at
        digits = {
            chr(code)
            for low, high in re.findall(r"(\d)(?:-(\d))?", members)
            for code in range(ord(low), ord(high or low) + 1)
        }
        return frozenset(digits), end + 1
    if char == "(" and (pattern[at + 1] != "?" or pattern.startswith("(?:", at)):
        inner, end = _alternatives(pattern, at + 3 if pattern[at + 1] == "?" else at + 1)
        return (inner, end + 1) if pattern[end : end + 1] == ")" else (None, at)
    return None, at


def _alternative_end(pattern: str, at: int) -> int:
    """Where the alternative going on at *at* ends: its "|", the ")" closing it, or the end."""
    depth = 0
    while at < len(pattern):
        char = pattern[at]
        if char == "\\":
            at += 1
        elif char == "[":
            at = pattern.index("]", at)
            if pattern[at - 1] in "[\\":  # "[]...]" or an escaped "]": not read
                raise IndexError(at)
        elif char == "(":
            depth += 1
        elif char == ")":
            if not depth:
                return at
            depth -= 1
        elif char == "|" and not depth:
            return at
        at += 1
    return at


def _group_end(pattern: str, at: int) -> int:
    while pattern[at : at + 1] == "|":
        at = _alternative_end(pattern, at + 1)
    return at
