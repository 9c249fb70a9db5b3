"""Sub-commands of `bole`, one module each, listed in bole_cli.cli.COMMAND_MODULES.

Each module defines `register(app)`. Keep module tops light (typer, rich, bole_cli
catalogues): torch/triton/sglang/matplotlib/optuna are imported inside the command
function so `bole --help` stays instant. A command that prints data takes `--json`; a
command that prints none names itself in a module-level `JSON_EXEMPT = {"name": "why"}`
(tests/test_cli_conventions.py checks both).
"""

from __future__ import annotations

from pathlib import Path

#: --draft-vocab's help, one wording for the commands that price or run the drafter
DRAFT_VOCAB_HELP = "Draft over N hot tokens (SGLang's --speculative-token-map); default: all."


def path_value(text: str) -> Path:
    """A path option's value (typer's `parser=`): an empty one is refused by name, where
    typer's Path would read it as '.', the working folder."""
    import typer

    if not str(text).strip():
        raise typer.BadParameter("an empty path was given; name a file or folder")
    return Path(text)
