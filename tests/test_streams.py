"""stdout and stderr as a command-line tool's (bole_cli/streams.py, docs/design.md §7).

Real processes, real pipes: a reader that went away ends the run quietly with 141, a
stdout that cannot be written (a full disk, closed) is one line and exit 1, and a
character the terminal cannot encode never fails a command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX pipes and /dev/full")

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _bole(*args: str) -> list[str]:
    return [sys.executable, "-m", "bole_cli", *args]


@pytest.mark.parametrize("args", [
    ("models", "--json"),
    ("inspect-tree", "--synthetic", "--depth", "8", "--topk", "4", "--seed", "0"),
    ("--help",),
])
def test_a_closed_pipe_ends_quietly(args):
    """The reader is gone before the first write (`| head -c 0`): no message, exit 141."""
    proc = subprocess.Popen(_bole(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env())
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, stderr
    assert stderr == ""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_one_line_exit_1():
    with open("/dev/full", "w") as full:
        res = subprocess.run(_bole("models"), stdout=full, stderr=subprocess.PIPE,
                             text=True, env=_env(), timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "error: cannot write to standard output (No space left on device)"]


def test_a_closed_stdout_is_an_error_not_lost_output():
    res = subprocess.run(_bole("models"), stderr=subprocess.PIPE, text=True, env=_env(),
                         timeout=60, preexec_fn=lambda: os.close(1))
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "error: cannot write to standard output (it is closed)"]


def test_unencodable_characters_print_as_replacements(tmp_path):
    tree = tmp_path / "t.json"
    tree.write_text(json.dumps({"parents": [-1, 0, 0], "probs": [1, 0.6, 0.3],
                                "tokens": ["caf\u00e9", "\u2014x", "y"]}), encoding="utf-8")
    res = subprocess.run(_bole("inspect-tree", str(tree)), capture_output=True,
                         env=_env(PYTHONIOENCODING="ascii", LANG="C", LC_ALL="C"),
                         timeout=60)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    assert b"'caf?'" in res.stdout
    assert res.stderr == b""
