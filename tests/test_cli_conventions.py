"""The conventions every `bole` command follows (see bole_cli/cli.py).

These walk the whole registered command tree, so commands added later are held to them:
`--json` on every command that prints data, no heavy import on the `--help` path, errors
as one red line with exit 2 (bad input) or 1 (runtime failure), tracebacks only under
`bole --debug`, and a fast `bole --help`.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from bole_cli import __version__, cli
from bole_cli.errors import BoleError, InputError

HEAVY = ("torch", "triton", "sglang", "matplotlib", "optuna")
HELP_BUDGET_S = float(os.environ.get("BOLE_HELP_BUDGET_S", "0.5"))

try:  # click < 8.2 mixes stderr into stdout unless told not to
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()


def _bole() -> list[str]:
    """The installed `bole` console script (falls back to `python -m bole_cli.cli`)."""
    script = Path(sys.executable).with_name("bole")
    if script.exists():
        return [str(script)]
    found = shutil.which("bole")
    return [found] if found else [sys.executable, "-m", "bole_cli.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FORCE_COLOR", "NO_COLOR", "PYTHONPROFILEIMPORTTIME")}
    env.update(extra)
    return env


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env=_env(**env), timeout=60)


# ---- --json on every command that prints data -----------------------------------------
def leaf_commands(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(space-joined path, click command) for every leaf command under a click group."""
    subs = getattr(cmd, "commands", None)
    if subs:
        for name, sub in subs.items():
            yield from leaf_commands(sub, path + (name,))
    elif path:
        yield " ".join(path), cmd


def has_json(cmd: Any) -> bool:
    return any("--json" in getattr(p, "opts", ()) for p in cmd.params)


def json_violations(app: typer.Typer, exempt: dict[str, str]) -> list[str]:
    return [name for name, cmd in leaf_commands(typer.main.get_command(app))
            if not has_json(cmd) and name not in exempt]


def json_exemptions() -> dict[str, str]:
    """Commands that print no data, declared by their own modules as JSON_EXEMPT."""
    exempt: dict[str, str] = {}
    for module in cli.COMMAND_MODULES:
        exempt.update(getattr(importlib.import_module(module), "JSON_EXEMPT", {}))
    return exempt


def test_every_data_command_has_json():
    commands = dict(leaf_commands(typer.main.get_command(cli.app)))
    assert {"models", "hardware"} <= set(commands)
    assert json_violations(cli.app, json_exemptions()) == [], (
        "commands that print data take --json; a command that prints none lists itself "
        "in its module's JSON_EXEMPT = {'name': 'why'}")


def test_json_exemptions_are_current_and_explained():
    commands = dict(leaf_commands(typer.main.get_command(cli.app)))
    for name, why in json_exemptions().items():
        assert name in commands, f"JSON_EXEMPT names {name!r}, which is not a command"
        assert isinstance(why, str) and why.strip(), f"JSON_EXEMPT[{name!r}] needs a reason"
        assert not has_json(commands[name]), f"{name!r} has --json; drop its exemption"


def test_json_checker_catches_a_command_without_json():
    demo = typer.Typer()
    sub = typer.Typer()

    @demo.command("good")
    def good(json_out: bool = typer.Option(False, "--json")) -> None: ...

    @demo.command("quiet")
    def quiet() -> None: ...

    @sub.command("show")
    def show() -> None: ...

    @sub.command("list")
    def list_(json_out: bool = typer.Option(False, "--json")) -> None: ...

    demo.add_typer(sub, name="profile")
    assert json_violations(demo, {}) == ["quiet", "profile show"]
    assert json_violations(demo, {"quiet": "prints nothing", "profile show": "x"}) == []


# ---- no heavy imports, fast help --------------------------------------------------------
_HELP_SCRIPT = textwrap.dedent("""
    import contextlib, io, json, sys
    for name in sys.argv[1:]:
        __import__(name)
    import typer.main
    from bole_cli.cli import app
    root = typer.main.get_command(app)

    def leaves(cmd, path=()):
        subs = getattr(cmd, "commands", None)
        if subs:
            for n, s in subs.items():
                yield from leaves(s, path + (n,))
        elif path:
            yield list(path)

    paths = list(leaves(root))
    for argv in [["--help"], ["-h"], ["--version"]] + [p + [h] for p in paths for h in ("--help", "-h")]:
        with contextlib.redirect_stdout(io.StringIO()) as buf:
            root.main(argv, prog_name="bole", standalone_mode=False)
        assert buf.getvalue().strip(), argv
    print(json.dumps({"paths": paths, "modules": sorted(sys.modules)}))
""")


def _help_imports(tmp_path: Path, *preimport: str) -> dict:
    script = tmp_path / "help_imports.py"
    script.write_text(_HELP_SCRIPT)
    r = _run([sys.executable, str(script), *preimport], PYTHONPATH=str(tmp_path))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _heavy(modules: list[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_help_of_every_command_imports_nothing_heavy(tmp_path):
    out = _help_imports(tmp_path)
    assert ["models"] in out["paths"] and ["hardware"] in out["paths"]
    assert _heavy(out["modules"]) == []


def test_heavy_import_check_catches_a_heavy_import(tmp_path):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    assert _heavy(_help_imports(tmp_path, "sglang")["modules"]) == ["sglang"]


def test_bole_help_console_script_imports_nothing_heavy():
    r = _run([*_bole(), "--help"], PYTHONPROFILEIMPORTTIME="1")
    assert r.returncode == 0, r.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines()
                if line.startswith("import time:") and "|" in line]
    assert "bole_cli.cli" in imported and "bole_cli.catalog.models" in imported
    assert _heavy(imported) == []
    assert "Usage" in r.stdout and "models" in r.stdout and "hardware" in r.stdout


def test_bole_help_is_fast():
    times = []
    for _ in range(3):  # best of 3: tolerant of a busy CI machine
        t0 = time.perf_counter()
        r = _run([*_bole(), "--help"])
        times.append(time.perf_counter() - t0)
        assert r.returncode == 0, r.stderr
    assert min(times) < HELP_BUDGET_S, f"bole --help took {min(times):.3f} s (best of 3)"


# ---- --version ---------------------------------------------------------------------------
def test_version():
    r = runner.invoke(cli.app, ["--version"])
    assert r.exit_code == 0 and r.stdout == f"bole {__version__}\n"
    p = _run([*_bole(), "--version"])
    assert p.returncode == 0 and p.stdout == f"bole {__version__}\n" and p.stderr == ""


# ---- errors --------------------------------------------------------------------------------
def _boom(kind: str = typer.Argument("value")) -> None:
    if kind == "input":
        raise InputError("bad node [/7] in tree.yaml\nsecond line")
    if kind == "runtime":
        raise BoleError("no CUDA device")
    if kind == "interrupt":
        raise KeyboardInterrupt
    raise ValueError("kaboom")


@pytest.fixture
def boom_app():
    """The real app with a `boom KIND` command that fails on purpose."""
    before = list(cli.app.registered_commands)
    cli.app.command("boom")(_boom)
    try:
        yield cli.app
    finally:
        cli.app.registered_commands[:] = before


def _one_line(stderr: str) -> str:
    lines = stderr.strip("\n").splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.mark.parametrize("kind,code,line", [
    ("input", 2, "error: bad node [/7] in tree.yaml second line"),  # markup shown as-is
    ("runtime", 1, "error: no CUDA device"),
    ("value", 1, "error: ValueError: kaboom"),
    ("interrupt", 130, "error: interrupted"),
])
def test_errors_are_one_line_with_exit_code(boom_app, kind, code, line):
    r = runner.invoke(boom_app, ["boom", kind])
    assert r.exit_code == code
    assert r.stdout == ""
    assert _one_line(r.stderr) == line
    assert "Traceback" not in r.stderr


def test_debug_shows_the_traceback(boom_app):
    r = runner.invoke(boom_app, ["--debug", "boom", "input"])
    assert r.exit_code == 2
    assert r.stderr.startswith("Traceback (most recent call last):")
    assert "raise InputError" in r.stderr
    assert r.stderr.rstrip("\n").splitlines()[-1] == (
        "error: bad node [/7] in tree.yaml second line")
    # --debug does not stick to the next invocation, even one that fails to parse.
    r = runner.invoke(boom_app, ["--bogus"])
    assert "Traceback" not in r.stderr and r.exit_code == 2
    r = runner.invoke(boom_app, ["boom", "runtime"])
    assert "Traceback" not in r.stderr and r.exit_code == 1


@pytest.mark.parametrize("argv", [["boom", "--debug", "input"], ["boom", "input", "--debug"]])
def test_debug_after_the_command_shows_the_traceback(boom_app, argv):
    r = runner.invoke(boom_app, argv)
    assert r.exit_code == 2
    assert r.stderr.startswith("Traceback (most recent call last):")


def test_debug_past_the_separator_is_left_to_the_other_program():
    assert cli._debug_first(["serve", "--", "--debug"]) == ["serve", "--", "--debug"]
    assert cli._debug_first(["serve", "--debug", "--", "--debug"]) == [
        "--debug", "serve", "--", "--debug"]


@pytest.mark.parametrize("argv,text", [
    (["--bogus"], "No such option: --bogus (see 'bole --help')"),
    (["nosuch"], "No such command 'nosuch'"),
    (["models", "--bogus"], "No such option: --bogus (see 'bole models --help')"),
    (["models", "9b", "extra"], "Got unexpected extra argument"),
])
def test_usage_errors_are_one_line_exit_2(argv, text):
    r = runner.invoke(cli.app, argv)
    assert r.exit_code == 2
    assert text in _one_line(r.stderr)


def test_subprocess_input_error_is_one_red_line():
    p = _run([*_bole(), "models", "no-such-model"])
    assert p.returncode == 2 and p.stdout == ""
    assert _one_line(p.stderr).startswith("error: unknown model 'no-such-model'; known: ")
    p = _run([*_bole(), "models", "no-such-model"], FORCE_COLOR="1", TERM="xterm-256color")
    assert p.returncode == 2
    assert p.stderr.startswith("\x1b[1;31merror:")  # bold red
    assert len(p.stderr.strip().splitlines()) == 1


_BOOM_SCRIPT = textwrap.dedent("""
    import typer
    from bole_cli import cli
    from bole_cli.errors import BoleError, InputError

    @cli.app.command("boom")
    def boom(kind: str) -> None:
        if kind == "input":
            raise InputError("bad node 7")
        if kind == "runtime":
            raise BoleError("no CUDA device")
        raise ValueError("kaboom")

    cli.main()
""")


@pytest.mark.parametrize("kind,code", [("input", 2), ("runtime", 1), ("value", 1)])
def test_subprocess_exit_codes_and_debug(tmp_path, kind, code):
    script = tmp_path / "boom.py"
    script.write_text(_BOOM_SCRIPT)
    p = _run([sys.executable, str(script), "boom", kind])
    assert p.returncode == code, p.stderr
    assert "Traceback" not in p.stderr
    _one_line(p.stderr)
    p = _run([sys.executable, str(script), "--debug", "boom", kind])
    assert p.returncode == code
    assert "Traceback (most recent call last)" in p.stderr
    assert re.search(r"^error: ", p.stderr.splitlines()[-1])


def test_subprocess_json_is_machine_readable():
    p = _run([*_bole(), "models", "9b", "--json"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["name"] == "Qwen/Qwen3.5-9B"
    p = _run([*_bole(), "hardware", "--json"])
    assert p.returncode == 0, p.stderr
    assert [g["key"] for g in json.loads(p.stdout)["gpus"]][2] == "h200"


# ---- the suite's shared setup (tests/conftest.py) ----------------------------------------
def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_triton_interpreter_without_cuda():
    if _cuda():
        pytest.skip("CUDA present: kernels compile for the device")
    assert os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.gpu
def test_gpu_marker_runs_only_with_cuda():
    assert _cuda()


@pytest.mark.gpu_slow
def test_gpu_slow_marker_runs_only_with_cuda():
    assert _cuda()


def test_gpu_markers_are_registered():
    """Both GPU markers are declared (an undeclared one would be a typo that never skips)."""
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"gpu:' in text and '"gpu_slow:' in text


def test_hypothesis_profile_has_no_deadline():
    hypothesis = pytest.importorskip("hypothesis")
    assert hypothesis.settings.default.deadline is None


LONG = "/tmp/" + "deep/" * 30 + "it's a name.yaml"


@pytest.mark.parametrize("path", ["/tmp/t/a b.yaml", "/tmp/t/my prof's.yaml", "/tmp/p.yaml", LONG,
                                  LONG.replace("'", "").replace(" ", "_"), "/x/" + "'" * 60,
                                  "/tmp/" + "模型" * 30 + ".yaml"])
@pytest.mark.parametrize("width, one_line", [(24, True), (80, True), (400, True), (80, False)])
def test_shell_lines_paste_back_to_the_same_command(path, width, one_line):
    """A command shown for pasting (serve's launch, calibrate's and acceptance's hints):
    read back as a shell reads it (a backslash-newline removed), it is the same argv,
    whatever the width, quotes and spaces; every line fits the width in cells (a wide
    character two), a path longer than that cut inside its word; on one line only where
    it fits and is allowed to."""
    import shlex

    from rich.cells import cell_len

    from bole_cli.console import shell_lines

    argv = ["bole", "calibrate", "--gpu", "GPU", "--model", "M", "--acceptance", path]
    lines = shell_lines(argv, width=width, one_line=one_line)
    assert shlex.split("\n".join(lines).replace("\\\n", "")) == argv
    assert all(cell_len(ln) <= width for ln in lines)
    assert all(ln.endswith("\\") for ln in lines[:-1]) and not lines[-1].endswith("\\")
    one_fits = one_line and cell_len(shlex.join(argv)) <= width
    assert (len(lines) == 1) == one_fits
    if not one_fits:
        assert lines[0] == "bole calibrate \\" and lines[1] == "  --gpu GPU \\"
    env_lines = shell_lines(["python", "-m", "x", "--a", "1"], {"K": "v w"}, one_line=False)
    assert env_lines == ["K='v w' \\", "  python -m x \\", "  --a 1"]


@pytest.mark.parametrize("path", ["/tmp/a\nb.yaml", "/tmp/\x1b[31mred\x1b[0m.yaml", "/t/tab\there's\\x41",
                                  "/t/\x85\u2028\U000e0001" + "模" * 3, "/tmp/" + "\x07é'" * 40,
                                  "/t/latin1-\udce9.yaml"])
@pytest.mark.parametrize("width, one_line", [(24, True), (80, True), (400, True), (80, False)])
@pytest.mark.parametrize("locale", ["C.UTF-8", "C"])
def test_a_word_that_does_not_print_is_shown_escaped_and_pastes_back(path, width, one_line, locale):
    """A path holding a newline or ESC is shown as bash's $'...' (so it cannot drive the
    terminal or break the lines), cut like any word where long; bash reads it back whole."""
    import shutil

    from rich.cells import cell_len

    from bole_cli.console import shell_lines

    bash = shutil.which("bash")
    assert bash, "bash reads the commands back"
    argv = ["bole", "serve", "--host", "h", "--profile", path]
    lines = shell_lines(argv, {"K": path}, width=width, one_line=one_line)
    assert all(ln.isprintable() and cell_len(ln) <= width for ln in lines)
    script = "f() { printf '%s\\0' \"$@\" \"$K\"; }\n" + "\n".join(lines).replace("bole serve", "f bole serve", 1)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": locale}
    got = subprocess.run([bash, "-c", script.encode("utf-8", "surrogateescape")], capture_output=True, env=env,
                         check=True).stdout.decode("utf-8", "surrogateescape")
    assert got.split("\0")[:-1] == argv + [path]


def test_a_path_shown_for_pasting_keeps_its_emoji_codes(tmp_path, monkeypatch):
    """Rich prints ':smile:' as a picture unless told not to, markup off or not: the
    calibrate hint's path must print as it is (found by a review)."""
    import shlex

    from typer.testing import CliRunner

    from bole_cli import cli
    from bole_cli.catalog import hardware as hw

    monkeypatch.setattr(hw, "detect_gpu", lambda index=None: None)
    out = tmp_path / ":smile:" / "it's a.yaml"
    r = CliRunner().invoke(cli.app, ["calibrate", "--gpu", "h200", "--model", "9b", "--batch", "8",
                                     "--kv", "4096", "--no-plot", "--out", str(out)],
                           env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("bole serve "))
    assert shlex.split(line)[-1] == str(out)


def test_a_progress_bar_writes_nothing_where_stderr_is_not_a_terminal():
    """A log file (stderr redirected) gets no bar and no stray empty line from it."""
    code = ("from bole_cli.console import progress_bar\n"
            "with progress_bar(3, 'x') as step:\n"
            "    for _ in range(3): step('y')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")})
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", done
