"""Error types the CLI turns into one red line and an exit code.

InputError (exit 2) means the user gave something wrong: a file, a field, a node, a name.
BoleError (exit 1) means the input was fine but the work failed (no GPU, a failed run).
Both subclass ValueError/RuntimeError so library callers can catch them normally.
"""

from __future__ import annotations


class BoleError(RuntimeError):
    """A runtime failure: the request was valid but could not be carried out."""

    exit_code = 1


class InputError(BoleError, ValueError):
    """Bad input from the user; the message names the field, node or argument at fault."""

    exit_code = 2


def brief(value: object, width: int = 40) -> str:
    """A bad value as a message shows it: repr cut to `width` characters, and a huge int
    by its size (its repr may be thousands of digits, or refused by Python's int limit)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    if isinstance(value, (list, tuple, dict)) and len(value) > 8:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."
