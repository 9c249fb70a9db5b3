"""Ctrl-C that never loses a measurement and never prints a traceback (docs/design.md §7).

`bole` installs `on_sigint` for the whole run: it counts the interrupt and raises
KeyboardInterrupt, as Python's own handler does, so a sweep can stop and keep what it
measured. Work that must not be cut in half (summarising and writing a profile) runs under
`held()`: an interrupt there is remembered (the guard's `.interrupted`) and the caller
decides what to do once the block is done. The count
also catches an interrupt that a library swallowed (torch's import can), so the run still
ends with exit code 130.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

_state: dict[str, Any] = {"count": 0, "holding": 0, "pending": False}


def on_sigint(signum: int, frame: Any) -> None:
    """SIGINT: count it; raise KeyboardInterrupt unless a held section defers it."""
    _state["count"] += 1
    if _state["holding"]:
        _state["pending"] = True
        return
    raise KeyboardInterrupt


def install() -> None:
    """Use on_sigint for SIGINT (main thread only; elsewhere signals cannot be set)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_sigint)


def ignore_further() -> None:
    """After the first interrupt is reported: a second Ctrl-C during shutdown must not
    print `Exception ignored in threading._shutdown`."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupt_count() -> int:
    """How many SIGINTs on_sigint saw, held or raised (swallowed ones included)."""
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
