"""Shared output helpers: Rich consoles, JSON emission and atomic file writes."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from rich.console import Console

from bole_cli.errors import BoleError, InputError

# no emoji: Rich would print a path's ":smile:" as a picture, even with markup off, and a
# command shown for pasting must paste back as it was
out = Console(highlight=False, emoji=False)
err = Console(stderr=True, highlight=False, emoji=False)


def add_columns(table: Any, names, text=()) -> None:
    """Add `names` to a Rich table: those in `text` (labels, decisions) left-aligned and folding
    first when the terminal is narrow, the figures right-aligned, never wrapped, and cut with a
    visible "…" only where the table cannot fit at all (docs/design.md §7)."""
    for name in names:
        label = name in text
        table.add_column(name, justify="left" if label else "right", no_wrap=not label,
                         overflow="fold" if label else "ellipsis")


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps_json(data: Any) -> str:
    """Stable, machine-readable JSON (sorted keys, no NaN surprises hidden)."""
    return json.dumps(data, indent=2, sort_keys=True, default=_jsonable)


def emit_json(data: Any) -> None:
    """Print JSON to stdout without Rich markup or wrapping."""
    print(dumps_json(data))


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once at import: umask() is process-wide and briefly changes it


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    return probe


def _name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def check_name_lengths(path: Path, what: str) -> None:
    """Every part of `path` fits the file system's name limit (NAME_MAX, 255 bytes on
    most), so a long --out or --tag fails here, not after the work."""
    limit = _name_max(_nearest_existing(path.parent))
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > limit:
            raise InputError(f"{what}: the name {part[:24]}... is {size} bytes long; a "
                             f"file name holds at most {limit}")


def check_not_a_record(path: Path, what: str) -> None:
    """Refuse to write over the repository's records: anything in the shipped profiles
    (paths.shipped_profiles_dir, a checkout's or an installed wheel's: a shipped
    profile is replaced by hand after review), and an existing file in a checkout's
    experiments/ (paths.repository_experiments: a new record there is the team's to add).
    A user's run goes to the user's space."""
    from bole_cli.paths import repository_experiments, shipped_profiles_dir

    try:
        resolved = path.resolve()
        profiles = shipped_profiles_dir().resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
        raise InputError(f"{what}: cannot resolve {path} ({exc})") from None
    if resolved.is_relative_to(profiles):
        raise InputError(f"{what}: {path} is in the shipped profiles ({profiles}); write it "
                         "elsewhere and copy it there by hand once reviewed")
    experiments = repository_experiments()
    if experiments is not None and resolved.is_relative_to(experiments.resolve()) and resolved.exists():
        raise InputError(f"{what}: {path} is one of the repository's records ({experiments}); "
                         "write elsewhere, or under a new name")


def check_writable(path: str | os.PathLike, what: str) -> Path:
    """Refuse, before any long work, an output file that cannot be written: a name too
    long for the file system, its folder (or the nearest existing one above it) is not a
    folder or takes no new file (/proc, read-only, no permission), or the path is a folder
    or not a regular file. The message names `what` (the flag, e.g. "--out") and the
    user's path."""
    path = Path(path)
    if str(path) in ("", "."):
        raise InputError(f"{what}: an empty path was given; name a file")
    check_name_lengths(path, what)
    if path.is_dir():
        raise InputError(f"{what}: {path} is a directory; give a file path")
    check_not_a_record(path, what)
    if os.path.lexists(path) and path.exists() and not path.is_file():
        raise InputError(f"{what}: {path} is not a regular file")
    folder = _nearest_existing(path.parent)
    if not folder.is_dir():
        raise InputError(f"{what}: cannot write {path}: {folder} is not a directory")
    try:  # the real test: a file can be made there (root passes os.access on /proc)
        fd, probe = tempfile.mkstemp(prefix=".bole-probe.", dir=folder)
    except OSError as exc:
        raise InputError(f"{what}: cannot write {path} ({exc.strerror or exc} in "
                         f"{folder})") from None
    os.close(fd)
    os.unlink(probe)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write a file so a reader sees either the old or the new content, never half of it.
    A failure (full disk, no permission) is a BoleError naming `path`, not the temp file."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise BoleError(f"cannot write {path} ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a plain file respects the umask
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise BoleError(f"cannot write {path} ({exc.strerror or exc}); the old file, if "
                        "any, is unchanged") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def shown_text(text: str) -> str:
    """A string from a user's file (a config's _name_or_path, a path) for a Rich print:
    markup escaped, and repr'd when it holds a control character (ESC as \\x1b), so a
    downloaded config.json cannot drive the terminal."""
    from rich.markup import escape

    from bole_cli.errors import brief

    return escape(text if text.isprintable() else brief(text, 200))


def shell_lines(argv: list[str], env: Optional[dict] = None, *, width: int = 80,
                one_line: bool = True) -> list[str]:
    """A command as lines that paste into a shell, every word quoted: on one line when it
    fits `width` columns (and `one_line`), else the environment, the program, then one flag
    (with its value) a line, each but the last ending in a backslash; a longer line (a long
    path) cut to fit. Printed outside any panel, so a copy picks up no border."""
    from rich.cells import cell_len

    head = [f"{k}={shell_quote(v)}" for k, v in (env or {}).items()]
    one = " ".join(head + [shell_join(argv)])
    if one_line and cell_len(one) <= width:
        return [one]
    groups: list[list[str]] = []
    for arg in argv:
        if arg.startswith("--") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    lines = [" ".join(head)] if head else []
    lines += [("  " if head else "") + shell_join(groups[0])]  # the program and its subcommand
    lines += ["  " + shell_join(g) for g in groups[1:]]
    lines = [line + " \\" for line in lines[:-1]] + lines[-1:]
    return [part for line in lines for part in _fold(line, width)]


def shell_quote(word: str) -> str:
    """One word for a shell: shlex.quote's, or where the word holds a character that does not
    print (a newline, ESC), bash's $'...' with every such character, the backslash and the
    quote written as an escape, so the terminal shows it and the shell reads it back."""
    import shlex

    if word.isprintable():
        return shlex.quote(word)
    return "$'" + "".join(_ansi_c(ch) for ch in word) + "'"


def _ansi_c(ch: str) -> str:
    if ch.isprintable() and ch not in "\\'":
        return ch
    if ch in "\n\t":
        return repr(ch)[1:-1]
    try:  # its UTF-8 bytes, as the file system has them (a non-UTF-8 byte is a surrogate here):
        raw = ch.encode("utf-8", "surrogateescape")  # \xHH reads back in any locale, \u not in C
    except UnicodeEncodeError:
        raw = ch.encode("utf-8", "surrogatepass")
    return "".join(f"\\x{b:02x}" for b in raw)


def shell_join(words: list[str]) -> str:
    """Words as one shell line (shell_quote each): a recorded command that pastes back."""
    return " ".join(shell_quote(w) for w in words)


def invoked_command() -> str:
    """This run's `bole ...` line as typed, quoted to paste back (results' provenance)."""
    return shell_join(["bole"] + sys.argv[1:])


_ESCAPE_LEN = {"x": 4}  # _ansi_c's escapes: \xHH (a byte), else two characters (\n, \t)


def _fold(line: str, width: int) -> list[str]:
    """A line of quoted words cut into lines of at most `width` columns (a wide character
    counts two) where it is longer, each cut a backslash-newline, which the shell removes:
    inside a single-quoted word the quote is closed before it and opened again after (a $'...'
    word opened again as one, never cut inside an escape); never inside the double quotes of
    the '"'"' that shlex.quote writes for a quote."""
    from rich.cells import cell_len

    out: list[str] = []
    while cell_len(line) > width:
        single = double = ansi = False
        cut, used, skip = None, 0, 0
        for i, ch in enumerate(line):
            used += cell_len(ch)
            if used > width - 2:  # room for a closing quote and the backslash
                break
            if skip:
                skip -= 1
            elif ansi and ch == "\\":
                skip = _ESCAPE_LEN.get(line[i + 1:i + 2], 2) - 1
            elif ch == "'" and not double:
                ansi = not single and i > 0 and line[i - 1] == "$"
                single = not single
            elif ch == '"' and not single:
                double = not double
            if i > 0 and not double and not skip and not (ch == "$" and line[i + 1:i + 2] == "'"):
                cut, cut_single, cut_ansi = i + 1, single, ansi
        if cut is None:
            break
        head, line = line[:cut], line[cut:]
        out.append(head + ("'\\" if cut_single else "\\"))
        line = ("$'" if cut_ansi else "'" if cut_single else "") + line
    return out + [line]


@contextlib.contextmanager
def progress_bar(total: int, description: str) -> Iterator[Callable[[str], None]]:
    """A transient progress bar on stderr for long work; yields a callback that advances
    it one step and shows the given description. None where stderr is not a terminal (a
    log file gets no bar, nor the empty line Rich leaves)."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=err,
                  transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task(description, total=total)
        yield lambda d: progress.update(task, advance=1, description=d)


def save_figure(fig: Any, path: str | os.PathLike) -> Path:
    """Save a matplotlib figure atomically (format from the path's suffix)."""
    import io

    buf = io.BytesIO()
    suffix = Path(path).suffix.lstrip(".") or "png"
    fig.savefig(buf, format=suffix, dpi=120, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())
