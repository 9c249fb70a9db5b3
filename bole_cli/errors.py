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
