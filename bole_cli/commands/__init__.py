"""Sub-commands of `bole`, one module each, listed in bole_cli.cli.COMMAND_MODULES.

Each module defines `register(app)`. Keep module tops light (typer, rich, bole_cli
catalogues): torch/triton/sglang/matplotlib/optuna are imported inside the command
function so `bole --help` stays instant. A command that prints data takes `--json`; a
command that prints none names itself in a module-level `JSON_EXEMPT = {"name": "why"}`
(tests/test_cli_conventions.py checks both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: --draft-vocab's help, one wording for the commands that price or run the drafter
DRAFT_VOCAB_HELP = "Draft over N hot tokens (SGLang's --speculative-token-map); default: all."


def int_value(text: "str | int") -> int:
    """An integer option's value (typer's `parser=`, metavar INTEGER): ASCII digits and a
    minus sign, as the list options take (bole_cli.parsing.is_decimal), at most
    MAX_INT_DIGITS of them (no option takes more; a seed or a port would be read wrong);
    the range is the command's to check, by name."""
    import typer

    from bole_cli.parsing import MAX_INT_DIGITS, is_decimal, quoted

    if isinstance(text, int):  # a default
        return text
    value = text.strip()
    if not is_decimal(value):
        raise typer.BadParameter(f"expected an integer, got {quoted(text)}")
    if len(value.lstrip("-")) > MAX_INT_DIGITS:
        raise typer.BadParameter(f"expected an integer of at most {MAX_INT_DIGITS} digits, got {quoted(text)}")
    return int(value)


def int_option(default: Any, *decls: str, metavar: str = "INTEGER", **kwargs: Any) -> Any:
    """typer.Option for an integer, read by int_value: every integer option takes what the
    list options take."""
    import typer

    return typer.Option(default, *decls, parser=int_value, metavar=metavar, **kwargs)


def float_value(text: "str | float") -> float:
    """A number option's value (typer's `parser=`, metavar NUMBER): digits, a point and an
    exponent (bole_cli.parsing.is_decimal_number); the range is the command's to check."""
    import typer

    from bole_cli.parsing import is_decimal_number, quoted

    if isinstance(text, (int, float)):  # a default
        return float(text)
    if not is_decimal_number(text.strip()):
        raise typer.BadParameter(f"expected a number, got {quoted(text)}")
    return float(text)


def float_option(default: Any, *decls: str, metavar: str = "NUMBER", **kwargs: Any) -> Any:
    """typer.Option for a number, read by float_value."""
    import typer

    return typer.Option(default, *decls, parser=float_value, metavar=metavar, **kwargs)


def path_value(text: str) -> Path:
    """A path option's value (typer's `parser=`): an empty one is refused by name, where
    typer's Path would read it as '.', the working folder."""
    import typer

    if not str(text).strip():
        raise typer.BadParameter("an empty path was given; name a file or folder")
    return Path(text)
