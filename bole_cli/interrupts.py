"""Ctrl-C and SIGTERM that never lose a measurement and never print a traceback
(docs/design.md §7).

`bole` installs `on_signal` for SIGINT and SIGTERM for the whole run: it counts the signal
and raises KeyboardInterrupt (`Terminated`, a subclass, for SIGTERM), as Python's own handler
does for Ctrl-C, so a sweep can stop and keep what it measured, and the run ends with one
line and 128 + the signal's number (130, 143: `exit_code()`). Work that must not be cut in
half (summarising and writing a profile) runs under `held()`: a signal there is remembered
(the guard's `.interrupted`) and the caller decides what to do once the block is done.
A signal that lands inside an import is delivered when the import is done: raised there it
would leave a half-imported module (numpy without `minimum`) or be swallowed by the
library (torch's import can), and the run would go on; one raised inside a compiled
library's callback, where Python can only print `Exception ignored`, is sent again. The count also catches an interrupt
that a library swallowed anyway, so the run still ends with its exit code.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Any, Iterator

_state: dict[str, Any] = {"count": 0, "holding": 0, "pending": False, "signum": 0,
                          "after_import": False}
_SIGNALS = ("SIGINT", "SIGTERM")
#: How often the main thread is looked at while a signal waits for an import to finish.
_IMPORT_POLL_S = 0.005


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is (the same handlers keep what was measured)."""


def _importing(frame: Any) -> bool:
    """Whether `frame` (the main thread's, where the signal landed) is inside an import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _deliver_after_import() -> None:
    """Wait (in a thread) until the main thread leaves every import, then send the signal
    to it again: a real signal (pthread_kill), so a blocking call there is cut short as the
    first one would have been (_thread.interrupt_main would wait for it to return)."""
    main = threading.main_thread()
    while main.is_alive():
        time.sleep(_IMPORT_POLL_S)
        frame = sys._current_frames().get(main.ident)
        if frame is None:
            return
        if not _importing(frame):
            signal.pthread_kill(main.ident, _state["signum"] or signal.SIGINT)
            return


def on_signal(signum: int, frame: Any) -> None:
    """SIGINT or SIGTERM: count it; raise unless a held section or an import defers it."""
    if not _state["after_import"]:  # a delivery deferred from an import was counted then
        _state["count"] += 1
        _state["signum"] = signum
    if _state["holding"]:
        _state["pending"] = True
        _state["after_import"] = False
        return
    if _importing(frame):
        _send_again()
        return
    _state["after_import"] = False
    raise Terminated() if _state["signum"] == signal.SIGTERM else KeyboardInterrupt()


def _send_again() -> None:
    """Deliver the current signal again once the main thread is out of any import."""
    if not _state["after_import"]:
        _state["after_import"] = True
        threading.Thread(target=_deliver_after_import, daemon=True).start()


def _unraisable(hook_args: Any) -> None:
    """A KeyboardInterrupt raised where Python cannot propagate it (a callback inside a
    compiled library) would print `Exception ignored` and be lost: send the signal again,
    a moment later, where it can be raised. Anything else goes to Python's hook."""
    if isinstance(hook_args.exc_value, KeyboardInterrupt) and _state["count"]:
        _send_again()
        return
    sys.__unraisablehook__(hook_args)


on_sigint = on_signal  # the name earlier callers know


def install() -> None:
    """Use on_signal for SIGINT and SIGTERM (main thread only; elsewhere signals cannot
    be set)."""
    if threading.current_thread() is threading.main_thread():
        for name in _SIGNALS:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), on_signal)
        sys.unraisablehook = _unraisable


def exit_code() -> int:
    """128 + the last signal's number, as a shell reports a process it ended: 130 for
    Ctrl-C, 143 for SIGTERM."""
    return 128 + int(_state["signum"] or signal.SIGINT)


def reason() -> str:
    """The one word the run ends with: interrupted (Ctrl-C) or terminated (SIGTERM)."""
    return "terminated" if _state["signum"] == signal.SIGTERM else "interrupted"


def ignore_further() -> None:
    """After the first interrupt is reported: a second Ctrl-C during shutdown must not
    print `Exception ignored in threading._shutdown`."""
    if threading.current_thread() is threading.main_thread():
        for name in _SIGNALS:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)


def interrupt_count() -> int:
    """How many signals on_signal saw, held or raised (swallowed ones included)."""
    return int(_state["count"])


class Held:
    """What `held()` yields: `interrupted` is True once the block saw a Ctrl-C."""

    def __init__(self) -> None:
        self.start = _state["count"]

    @property
    def interrupted(self) -> bool:
        return _state["count"] > self.start


@contextlib.contextmanager
def held() -> Iterator[Held]:
    """Run the block to its end even if Ctrl-C arrives; the caller reads
    `.interrupted` afterwards and stops then. Nests; a no-op for the signal when
    on_sigint is not installed (then the block is simply run)."""
    h = Held()
    _state["holding"] += 1
    try:
        yield h
    finally:
        _state["holding"] -= 1
        if not _state["holding"]:
            _state["pending"] = False


@contextlib.contextmanager
def released() -> Iterator[None]:
    """Inside a held() block: let Ctrl-C raise again (a sweep stops on it); leaving the
    block holds it once more, so no gap opens between the two."""
    saved = _state["holding"]
    _state["holding"] = 0
    try:
        yield
    finally:
        _state["holding"] = saved
