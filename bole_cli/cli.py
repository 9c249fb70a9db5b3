"""The `bole` command line: one Typer app, one module per sub-command.

Conventions every command follows (see tests/test_cli_conventions.py):
- `--json` on every command that prints data; stable keys.
- Bad input -> one red line on stderr, exit 2; runtime failure -> exit 1;
  the traceback only with `bole --debug ...`.
- No torch/triton/sglang import on the `--help` path: command modules import them
  inside the command function.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any, Optional

import click
import typer
from typer.core import TyperGroup

from bole_cli import __version__
from bole_cli.errors import BoleError

# Each module defines `register(app)`; one line per sub-command module.
COMMAND_MODULES = (
    "bole_cli.commands.models",
    "bole_cli.commands.hardware",
)

_state = {"debug": False}


def _report(message: str, code: int) -> None:
    from bole_cli.console import err

    if _state["debug"]:
        err.print(traceback.format_exc(), markup=False, end="")
    err.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)
    raise typer.Exit(code)


class BoleGroup(TyperGroup):
    """Turns Bole's errors into one red line and the right exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:  # keep registration order
        return list(self.commands)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BoleError as exc:
            _report(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _report("interrupted", 130)
        except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
            _report(f"{type(exc).__name__}: {exc}", 1)


app = typer.Typer(
    cls=BoleGroup,
    name="bole",
    help="Bole: fast, exact tree speculative decoding for hybrid-attention (Gated DeltaNet) models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        print(f"bole {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(
        None, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
) -> None:
    """Bole: fast, exact tree speculative decoding for hybrid-attention (Gated DeltaNet) models."""
    _state["debug"] = debug


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
