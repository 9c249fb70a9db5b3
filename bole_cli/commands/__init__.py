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
    sign, as the list options take (bole_cli.parsing.is_decimal); the range is the
    command's to check, by name."""
    import typer

    from bole_cli.parsing import MAX_INT_CHARS, is_decimal, quoted

    if isinstance(text, int):  # a default
        return text
    if not is_decimal(text.strip()):
        too_long = len(text.strip()) > MAX_INT_CHARS
        raise typer.BadParameter(f"expected an integer{' below 10^24' if too_long else ''}, got {quoted(text)}")
    return int(text)


def int_option(default: Any, *decls: str, metavar: str = "INTEGER", **kwargs: Any) -> Any:
    """typer.Option for an integer, read by int_value: every integer option takes what the
    list options take."""
    import typer

    return typer.Option(default, *decls, parser=int_value, metavar=metavar, **kwargs)


def path_value(text: str) -> Path:
    """A path option's value (typer's `parser=`): an empty one is refused by name, where
    typer's Path would read it as '.', the working folder."""
    import typer

    if not str(text).strip():
        raise typer.BadParameter("an empty path was given; name a file or folder")
    return Path(text)
