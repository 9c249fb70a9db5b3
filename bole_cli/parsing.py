"""Parsing of the comma-separated option values the commands and the benches share."""

from __future__ import annotations

from bole_cli.errors import InputError


def parse_int_list(text: str, option: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: positive, distinct, sorted; InputError names the option."""
    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise InputError(f"{option}: expected a comma-separated list of positive integers")
    values = []
    for x in items:
        if not x:
            continue
        try:
            v = int(x)
        except ValueError:
            raise InputError(f"{option}: {x!r} is not a positive integer") from None
        if v < 1:
            raise InputError(f"{option}: {v} is not a positive integer")
        values.append(v)
    return sorted(set(values))
