"""Parsing and checking of the option values the commands and the benches share, with one
wording for a value out of range: `--batch: expected an integer >= 1, got 0`."""

from __future__ import annotations

import math
import re
from typing import Optional

from bole_cli.errors import InputError

#: No list option takes a value this large; it keeps a 400-digit typo from reaching a
#: sweep (or Python's int limits) and the message short. Callers may pass a lower cap.
INT_OPTION_MAX = 1 << 40


#: The most digits an integer option reads as a number: int() of thousands of digits is slow
#: or refused outright, and no option takes a number this long (INT_OPTION_MAX has 13 digits).
MAX_INT_DIGITS = 24


def quoted(text: str, width: int = 24) -> str:
    """A user's value quoted for a message, cut so a huge one stays one short line."""
    return repr(text) if len(text) <= width else repr(text[:width]) + f"... ({len(text)} chars)"


def expected_int(option: str, minimum: int, maximum: Optional[int] = None) -> str:
    """The one wording of an integer option's range: '--batch: expected an integer >= 1'."""
    if maximum is None:
        return f"{option}: expected an integer >= {minimum:,}"
    return f"{option}: expected an integer from {minimum:,} to {maximum:,}"


def check_int(value: Optional[int], option: str, *, minimum: int = 1,
              maximum: Optional[int] = None) -> Optional[int]:
    """`value` (None passes: the option was not given) within [minimum, maximum], else
    InputError naming the option, in the one wording."""
    if value is not None and (value < minimum or (maximum is not None and value > maximum)):
        shown = (f"{value:,}" if abs(value) < 10**MAX_INT_DIGITS
                 else f"more than {MAX_INT_DIGITS} digits")
        raise InputError(f"{expected_int(option, minimum, maximum)}, got {shown}")
    return value


def check_draft_vocab(value: Optional[int], vocab: int, top_k: int = 1) -> Optional[int]:
    """--draft-vocab: at least the drafter's top-k (a level drafts its top-k of the hot
    tokens), at most the model's vocabulary; None for the full vocabulary (also when it is
    named), what profiles record (profiles/schema.py)."""
    check_int(value, "--draft-vocab", minimum=top_k, maximum=vocab)
    return None if value == vocab else value


#: An integer as a user types one: ASCII digits, a minus sign at most (refused as below 1).
_DECIMAL = re.compile(r"-?[0-9]+")


def is_decimal(text: str) -> bool:
    """Whether `text` is an integer as a user types one (int() also takes '1_000', '+4'
    and full-width digits)."""
    return _DECIMAL.fullmatch(text) is not None


#: A decimal number as a user types one ('0.05', '.5', '1e-3'); float() also takes '1_0',
#: 'inf', 'nan' and full-width digits.
_DECIMAL_NUMBER = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


def is_decimal_number(text: str) -> bool:
    """Whether `text` is a finite number as a user types one ('1e999' is not: float()
    reads it as inf)."""
    return _DECIMAL_NUMBER.fullmatch(text) is not None and math.isfinite(float(text))


def parse_int_list(text: str, option: str, *, maximum: Optional[int] = None) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: positive, distinct, sorted, at most `maximum` (default
    INT_OPTION_MAX); InputError names the option and the value (a repeated one too: check_once)."""
    cap = INT_OPTION_MAX if maximum is None else maximum
    values = []
    for x in _items(text, option, "list of positive integers"):
        if not is_decimal(x):
            raise InputError(f"{expected_int(option, 1, maximum)}, got {quoted(x)}")
        if len(x.lstrip("-")) > MAX_INT_DIGITS:
            raise InputError(f"{expected_int(option, 1, cap)}, got more than {MAX_INT_DIGITS} digits")
        v = int(x)
        check_int(v, option, minimum=1, maximum=maximum if v >= 1 else None)
        check_int(v, option, minimum=1, maximum=cap)
        check_once(v, values, option, text, f"{v:,}")
        values.append(v)
    return sorted(values)


def parse_name_list(text: str, option: str) -> list[str]:
    """'a,b' -> ['a', 'b']: names in the order given; InputError names the option on an
    empty list or item, or a name given twice (check_once)."""
    items = _items(text, option, "list")
    for i, x in enumerate(items):
        check_once(x, items[:i], option, text, quoted(x))
    return items


def check_once(value, earlier, option: str, text, shown: str) -> None:
    """InputError naming the option when `value` of the list `text` is among `earlier`: a
    repeat is more often a typo ('1,4,4' for '1,4,16') than a wish to run it twice."""
    if value in earlier:
        raise InputError(f"{option}: {shown} appears twice in {quoted(str(text))}; give each value once")


def _items(text: str, option: str, what: str) -> list[str]:
    """A list option's comma-separated items, stripped; none empty (a stray comma is a typo,
    not a default): InputError naming the option."""
    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise InputError(f"{option}: expected a comma-separated {what}")
    if not all(items):
        raise InputError(f"{option}: an empty item in {quoted(str(text))}; expected a comma-separated {what}")
    return items
