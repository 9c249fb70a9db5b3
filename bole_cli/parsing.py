"""Parsing of the comma-separated option values the commands and the benches share."""

from __future__ import annotations

from typing import Optional

from bole_cli.errors import InputError

#: No list option takes a value this large; it keeps a 400-digit typo from reaching a
#: sweep (or Python's int limits) and the message short. Callers may pass a lower cap.
INT_OPTION_MAX = 1 << 40


def _shown(text: str, width: int = 24) -> str:
    """A user's value quoted for a message, cut so a huge one stays one short line."""
    return repr(text) if len(text) <= width else repr(text[:width]) + f"... ({len(text)} chars)"


def parse_int_list(text: str, option: str, *, maximum: Optional[int] = None) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: positive, distinct, sorted, at most `maximum` (default
    INT_OPTION_MAX); InputError names the option and the value."""
    cap = INT_OPTION_MAX if maximum is None else maximum
    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise InputError(f"{option}: expected a comma-separated list of positive integers")
    values = []
    for x in items:
        if not x:
            continue
        if len(x) > 24:  # int() of thousands of digits is slow or refused outright
            raise InputError(f"{option}: {_shown(x)} is too large (at most {cap:,})")
        try:
            v = int(x)
        except ValueError:
            raise InputError(f"{option}: {_shown(x)} is not a positive integer") from None
        if v < 1:
            raise InputError(f"{option}: {v} is not a positive integer")
        if v > cap:
            raise InputError(f"{option}: {v} is too large (at most {cap:,})")
        values.append(v)
    return sorted(set(values))
