"""Standard output and error as a command-line tool's should behave (docs/design.md §7).

`bole` wraps both streams once, at start-up, so that every writer (Rich, print, JSON) gets
the same rules without a check of its own:
- a closed pipe (`bole models --json | head -1`) is not an error: the run stops quietly,
  with exit code 141 as the shell reports SIGPIPE, and no message;
- any other failed write to stdout (a full disk, stdout closed with `>&-`) is one line
  naming standard output, exit 1, never output lost with exit 0;
- a character the terminal's encoding cannot show prints as `?` (one cell, so tables stay
  aligned), never an error;
- stderr that cannot be written loses the message, not the exit code.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

#: How the shell reports a process that SIGPIPE ended: 128 + 13.
EXIT_PIPE_CLOSED = 141


class OutputClosed(Exception):
    """The reader of stdout went away (EPIPE): stop quietly."""


class OutputFailed(Exception):
    """stdout could not be written for another reason; the message says why."""


class _Closed:
    """What stdout is when the process started with it closed: every write fails."""

    encoding = "utf-8"
    errors = "replace"

    def write(self, text: str) -> int:
        if not text:
            return 0
        raise OSError(errno.EBADF, "it is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "it is closed")


class GuardedStream:
    """A text stream whose failed writes become OutputClosed / OutputFailed (stdout) or
    are dropped (stderr: there is nowhere left to report them)."""

    def __init__(self, stream: Any, name: str, drop_errors: bool) -> None:
        self._stream = stream
        self._name = name
        self._drop = drop_errors

    def _failed(self, exc: OSError) -> None:
        if self._drop:
            return
        if exc.errno == errno.EPIPE:
            raise OutputClosed() from None
        raise OutputFailed(f"cannot write to standard {self._name} "
                           f"({exc.strerror or exc})") from None

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._failed(exc)
            return 0

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._failed(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _escape_unencodable(stream: Any) -> None:
    if hasattr(stream, "reconfigure"):
        try:
            stream.reconfigure(errors="replace")
        except (OSError, ValueError):  # a detached or closed stream: leave it
            pass


def _fd_closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def install() -> None:
    """Wrap sys.stdout and sys.stderr (once). A closed fd 1 is held by /dev/null, so a file
    opened later cannot become the process's stdout."""
    if isinstance(sys.stdout, GuardedStream):
        return
    stdout = sys.stdout
    if stdout is None or _fd_closed(1):
        if _fd_closed(1):
            fd = os.open(os.devnull, os.O_WRONLY)
            if fd != 1:
                os.dup2(fd, 1)
                os.close(fd)
        stdout = _Closed()
    _escape_unencodable(stdout)
    sys.stdout = GuardedStream(stdout, "output", drop_errors=False)  # type: ignore[assignment]
    if sys.stderr is not None:
        _escape_unencodable(sys.stderr)
        sys.stderr = GuardedStream(sys.stderr, "error", drop_errors=True)  # type: ignore[assignment]


def silence_stdout() -> None:
    """After OutputClosed: point fd 1 at /dev/null, so what is still buffered (and the
    interpreter's flush at exit) goes nowhere instead of failing again."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.close(fd)
    except OSError:
        pass


def flush_stdout() -> None:
    """Flush stdout now, so a failure the interpreter's exit would hide is reported."""
    if sys.stdout is not None:
        sys.stdout.flush()
