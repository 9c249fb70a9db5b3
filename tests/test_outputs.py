"""Where a user's run writes, and output names checked before the work (docs/design.md §7).

`bole bench` writes to the user's cache unless --out-dir names a folder (never into the
working directory, which in a checkout holds the repository's records); a name the file
system cannot take fails at once naming the option; a plot that cannot follow its JSON
says the JSON was kept; a refusal for want of CUDA comes before torch's import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bole_cli import cli
from bole_cli.bench.e2e import report, sweep
from bole_cli.errors import BoleError

try:  # click < 8.2 mixes stderr into stdout unless told not to
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

ROOT = Path(__file__).resolve().parent.parent
LONG = "x" * 300


@pytest.fixture
def fake_e2e(monkeypatch):
    """bench e2e with its run and report replaced: what is left is where files go."""
    calls = []
    measured = {"device": "cpu", "results": [{"decoder": "ar", "error": ""}], "interrupted": False}
    monkeypatch.setattr(sweep, "run_e2e",
                        lambda cfg, progress=None: calls.append(cfg) or measured)
    monkeypatch.setattr(report, "tables", lambda data, width: [])
    monkeypatch.setattr(report, "notes", lambda data: [])
    monkeypatch.setattr(report, "plot", lambda data, path: Path(path).write_bytes(b"png"))
    return calls


def test_bench_writes_to_the_cache_not_the_working_directory(fake_e2e, tmp_path,
                                                              monkeypatch):
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("BOLE_CACHE_DIR", str(cache))
    r = runner.invoke(cli.app, ["bench", "e2e", "--device", "cpu", "--tiny"])
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in (cache / "results").iterdir()) == [
        "e2e-cpu-tiny.json", "e2e-cpu-tiny.png"]
    assert list(work.iterdir()) == []
    assert str(cache / "results" / "e2e-cpu-tiny.json") in r.stdout  # the path is printed


def test_out_dir_still_names_the_folder(fake_e2e, tmp_path):
    r = runner.invoke(cli.app, ["bench", "e2e", "--device", "cpu", "--tiny", "--out-dir",
                                str(tmp_path), "--tag", "mine", "--json"])
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "mine.json").exists() and (tmp_path / "mine.png").exists()
    assert str(tmp_path / "mine.json") in r.stderr  # under --json, stdout is the data


@pytest.mark.parametrize("argv, flag", [
    (["bench", "e2e", "--device", "cpu", "--tiny", "--tag", LONG], "--tag"),
    (["bench", "kernels", "--tag", LONG], "--tag"),
    (["bench", "e2e", "--device", "cpu", "--tiny", "--out-dir", "/tmp/" + LONG], "--out-dir"),
    (["calibrate", "--gpu", "a100", "--model", "9b", "--out", LONG + ".yaml"], "--out"),
    (["inspect-tree", "--synthetic", "--plot", LONG + ".png"], "--plot"),
])
def test_a_name_too_long_fails_before_the_work(fake_e2e, argv, flag):
    r = runner.invoke(cli.app, argv)
    assert r.exit_code == 2, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith(f"error: {flag}:"), line
    assert "at most 255" in line
    assert fake_e2e == []


def test_a_plot_that_cannot_follow_its_json_says_so(fake_e2e, tmp_path, monkeypatch):
    def full_disk(data, path):
        raise BoleError(f"cannot write {path} (No space left on device)")

    monkeypatch.setattr(report, "plot", full_disk)
    r = runner.invoke(cli.app, ["bench", "e2e", "--device", "cpu", "--tiny", "--out-dir",
                                str(tmp_path)])
    assert r.exit_code == 1
    assert "wrote" in r.stderr and "e2e-cpu-tiny.json" in r.stderr
    assert "not its plot e2e-cpu-tiny.png" in r.stderr
    assert (tmp_path / "e2e-cpu-tiny.json").exists()


NO_DRIVER = textwrap.dedent('''
    import ctypes, sys
    real = ctypes.CDLL
    def no_cuda(name, *a, **k):
        if "cuda" in str(name):
            raise OSError(name + ": cannot open shared object file")
        return real(name, *a, **k)
    ctypes.CDLL = no_cuda
    from bole_cli.cli import main
    sys.argv = ["bole"] + sys.argv[1:]
    try:
        main()
    except SystemExit as exc:
        print("torch" in sys.modules, exc.code)
''')


@pytest.mark.parametrize("argv", [["bench", "kernels"], ["bench", "e2e"]])
def test_no_cuda_is_refused_before_torch_is_imported(argv, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), BOLE_CACHE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", NO_DRIVER, *argv], capture_output=True,
                         text=True, env=env, timeout=60)
    assert res.stdout.split() == ["False", "1"], res.stderr
    assert "needs a CUDA GPU" in res.stderr
