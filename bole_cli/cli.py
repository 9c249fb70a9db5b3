"""The `bole` command line: one Typer app, one module per sub-command.

Conventions every command follows (see tests/test_cli_conventions.py):
- `--json` on every command that prints data; stable keys.
- Bad input (InputError, a usage error) -> one red line on stderr, exit 2; runtime
  failure (BoleError, any other exception) -> exit 1; the traceback only with
  `bole --debug ...`.
- No torch/triton/sglang import on the `--help` path: command modules import them
  inside the command function. A command that prints no data names itself in its
  module's `JSON_EXEMPT = {"name": "why"}`.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any, Optional

import typer
from typer.core import TyperGroup

from bole_cli import __version__
from bole_cli.errors import BoleError

# Each module defines `register(app)`; one line per sub-command module.
COMMAND_MODULES = (
    "bole_cli.commands.models",
    "bole_cli.commands.hardware",
    "bole_cli.commands.inspect_tree",
    "bole_cli.commands.calibrate",
    "bole_cli.commands.bench",
    "bole_cli.commands.tune_kernels",
    "bole_cli.commands.serve",
)

_state = {"debug": False}

# Click's exception base, wherever this typer takes it from (typer >= 0.2x vendors click,
# older typer re-exports click's own classes): BadParameter always derives from it.
_ClickException: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _report(message: str, code: int) -> None:
    from rich.markup import escape

    from bole_cli.console import err

    if _state["debug"]:
        err.print(traceback.format_exc(), markup=False, highlight=False, end="",
                  soft_wrap=True)
    line = " ".join(str(message).split())  # one line, whatever the message holds
    err.print(f"[bold red]error:[/] {escape(line)}", markup=True, soft_wrap=True)
    raise typer.Exit(code)


def _report_usage(exc: Exception) -> None:
    """Click's usage errors (unknown option, missing argument, ...) as one red line."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # `bole` alone prints the help
        raise exc
    ctx = getattr(exc, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    message = exc.format_message().rstrip(".")  # type: ignore[attr-defined]
    _report(f"{message}{hint}", getattr(exc, "exit_code", 2))


class BoleGroup(TyperGroup):
    """Turns Bole's errors into one red line and the right exit code."""

    def list_commands(self, ctx: Any) -> list[str]:  # keep registration order
        return list(self.commands)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if ctx.parent is None:
            _state["debug"] = False  # set again by the root callback
        try:
            return super().parse_args(ctx, args)
        except _ClickException as exc:
            _report_usage(exc)
            raise  # pragma: no cover - _report_usage always raises

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise
        except _ClickException as exc:
            _report_usage(exc)
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
