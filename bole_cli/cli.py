"""The `bole` command line: one Typer app, one module per sub-command.

Conventions every command follows (see tests/test_cli_conventions.py):
- `--json` on every command that prints data; stable keys.
- Bad input (InputError, a usage error) -> one red line on stderr, exit 2; runtime
  failure (BoleError, any other exception) -> exit 1; the traceback only with
  `--debug` (anywhere before a `--`).
- No torch/triton/sglang import on the `--help` path: command modules import them
  inside the command function. A command that prints no data names itself in its
  module's `JSON_EXEMPT = {"name": "why"}`.
"""

from __future__ import annotations

import os  # loaded with the interpreter: free
import signal


def _leave_now(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM while the command line loads (typer, rich, the command modules),
    or once the command has finished: nothing is left to keep, so leave at once with one
    line and 128 + the signal (130, 143), not a traceback."""
    try:
        os.write(2, b"error: terminated\n" if signum == signal.SIGTERM
                 else b"error: interrupted\n")
    finally:
        os._exit(128 + signum)


try:  # first thing, so the window before it is as short as can be
    _previous_sigint = signal.signal(signal.SIGINT, _leave_now)
    _previous_sigterm = signal.signal(signal.SIGTERM, _leave_now)
    _MAIN_THREAD = True
except ValueError:  # imported from another thread: signals are the main thread's
    _previous_sigint = _previous_sigterm = None
    _MAIN_THREAD = False

import atexit  # noqa: E402 - after the handler above, on purpose
import importlib  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from typing import Any, Optional  # noqa: E402

import typer  # noqa: E402
from typer.core import TyperGroup  # noqa: E402

from bole_cli import __version__, interrupts, streams  # noqa: E402 - interrupts: main() installs it first thing
from bole_cli.errors import BoleError  # noqa: E402
from bole_cli.streams import OutputClosed, OutputFailed  # noqa: E402

# Each module defines `register(app)`; one line per sub-command module.
COMMAND_MODULES = (
    "bole_cli.commands.models",
    "bole_cli.commands.hardware",
    "bole_cli.commands.inspect_tree",
    "bole_cli.commands.calibrate",
    "bole_cli.commands.bench",
    "bole_cli.commands.tune_kernels",
    "bole_cli.commands.serve",
    "bole_cli.commands.acceptance",
)

_state = {"debug": False}
#: The longest error line printed: a message quoting a huge value stays readable.
MAX_ERROR_CHARS = 400


def _hide_flag_types() -> None:
    """Typer's help shows `<bool>` after every flag, as if it took a value: show nothing
    for flags (a plain --json takes none). Falls back to Typer's look if its API moves."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "_bole", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> Optional[str]:
        if getattr(self, "is_flag", False) and not getattr(self, "count", False):
            return None
        return shown(self, ctx)

    display_type_rich._bole = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_hide_flag_types()

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
    if len(line) > MAX_ERROR_CHARS:
        line = line[:MAX_ERROR_CHARS - 3] + "..."
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


def _report_interrupted() -> None:
    _report(interrupts.reason(), interrupts.exit_code())


def _debug_first(args: list[str]) -> list[str]:
    """`--debug` is the root's option, but a user adds it where the error showed up, after
    the sub-command: move it to the front. Not past `--`, where the words are another
    program's (`bole serve -- ...`)."""
    cut = args.index("--") if "--" in args else len(args)
    if "--debug" not in args[:cut]:
        return args
    return ["--debug", *(a for a in args[:cut] if a != "--debug"), *args[cut:]]


class BoleGroup(TyperGroup):
    """Turns Bole's errors into one red line and the right exit code."""

    def list_commands(self, ctx: Any) -> list[str]:  # keep registration order
        return list(self.commands)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if ctx.parent is None:
            _state["debug"] = False  # set again by the root callback
            args = _debug_first(args)
        try:
            return super().parse_args(ctx, args)
        except KeyboardInterrupt:
            _report_interrupted()
        except _ClickException as exc:
            _report_usage(exc)
            raise  # pragma: no cover - _report_usage always raises

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, OutputClosed, OutputFailed):
            raise  # the streams' failures end the run in main(), whoever wrote
        except _ClickException as exc:
            _report_usage(exc)
        except BoleError as exc:
            _report(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _report_interrupted()
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
    context_settings={"help_option_names": ["-h", "--help"]},  # every subcommand inherits it
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
    debug: bool = typer.Option(False, "--debug",
                               help="Show full tracebacks on errors (here or after the command)."),
) -> None:
    """Bole: fast, exact tree speculative decoding for hybrid-attention (Gated DeltaNet) models."""
    _state["debug"] = debug


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)

if _MAIN_THREAD:  # loaded: give the signals back (a library importer keeps its own handlers)
    signal.signal(signal.SIGINT, signal.default_int_handler if _previous_sigint is None
                  else _previous_sigint)
    signal.signal(signal.SIGTERM, signal.SIG_DFL if _previous_sigterm is None
                  else _previous_sigterm)


def _exit_interrupted() -> None:
    interrupts.ignore_further()
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - a closed pipe must not hide the exit code
        pass
    print(f"error: {interrupts.reason()}", file=sys.stderr, flush=True)
    sys.exit(interrupts.exit_code())


def _exit_code(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def _run_app() -> int:
    """The app's exit code, stdout flushed inside it, so a failed write at any point (a
    closed pipe, a full disk) takes the same road: bole_cli/streams.py."""
    try:
        app(prog_name="bole")
    except SystemExit as exc:
        code = _exit_code(exc)
    else:  # pragma: no cover - typer's standalone mode always exits
        code = 0
    streams.flush_stdout()
    return code


def main() -> None:
    """The `bole` entry point: Ctrl-C (SIGTERM) anywhere ends with one line and exit code
    130 (143); a closed stdout pipe ends quietly with 141, any other failed write with one
    line. Its handlers go in before anything else runs: the module is loaded with the
    command line (under _leave_now), so no import opens a window for Python's own handler
    and its traceback."""
    try:
        interrupts.install()
        streams.install()
        code = _run_app()
    except KeyboardInterrupt:
        _exit_interrupted()
    except OutputClosed:
        streams.silence_stdout()
        raise SystemExit(streams.EXIT_PIPE_CLOSED) from None
    except OutputFailed as exc:
        streams.silence_stdout()
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    if interrupts.interrupt_count() and code in (0, 1):  # an interrupt a library swallowed
        if code == 0:
            _exit_interrupted()
        interrupts.ignore_further()
        raise SystemExit(interrupts.exit_code())
    if _MAIN_THREAD:  # done and flushed: a signal from here on (shutdown) leaves at once
        signal.signal(signal.SIGINT, _leave_now)
        signal.signal(signal.SIGTERM, _leave_now)
        _state["finished"] = True
    raise SystemExit(code)


def _ignore_signals_last() -> None:
    """The last exit hook of a finished run (registered when the command line loads, before
    any library's, so run after theirs, while _leave_now still lets Ctrl-C cut a hung one):
    past it Python's finalization hands a Python handler back to SIG_DFL, and a signal
    there would end a finished run as killed by it, with no line; ignored, its code stands."""
    if _state.get("finished"):
        interrupts.ignore_further()


if _MAIN_THREAD:
    atexit.register(_ignore_signals_last)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
