"""Issue 18: every bad input is one short stderr line naming the field or file, exit 2,
within a second, checked before any long work (bole_cli.files, the validators, the
option checks). Hostile files: YAML alias bombs, huge or deep numbers, FIFOs, devices.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bole_cli import cli, files
from bole_cli.errors import BoleError, InputError

try:  # click < 8.2 mixes stderr into stdout unless told not to
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

DATA = Path(__file__).parent / "data"
CONFIG_9B = DATA / "configs" / "qwen3_5_9b.json"
LIMIT_S = 1.0
BOMB = ("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
        "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
        "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
        "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n")


def bad(*args: str, culprit: str, code: int = 2, env: dict | None = None) -> str:
    """Run `bole ARGS` in-process: exit `code`, one stderr line (short, no traceback)
    naming `culprit`, within LIMIT_S. Returns the line."""
    start = time.perf_counter()
    r = runner.invoke(cli.app, list(args), env=env)
    took = time.perf_counter() - start
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == code, (r.exit_code, r.stderr, r.stdout)
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and len(lines[0]) <= cli.MAX_ERROR_CHARS + 20
    assert culprit in lines[0], lines[0]
    assert took < LIMIT_S, f"{took:.2f} s"
    return lines[0]


def tree_file(tmp_path: Path, text: str, name: str = "t.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# ---- YAML alias bombs --------------------------------------------------------------------
@pytest.mark.parametrize("field", ["parents", "tokens", "log_probs"])
def test_alias_bomb_in_a_tree_field(tmp_path, field):
    fields = {"parents": "[-1, 0]", "log_probs": "[-0.1, -0.2]", "tokens": "[1, 2]"}
    fields[field] = "*f"
    text = BOMB + "".join(f"{k}: {v}\n" for k, v in fields.items())
    line = bad("inspect-tree", tree_file(tmp_path, text), culprit="YAML aliases expand")
    assert "t.yaml" in line


def test_alias_bomb_in_an_unknown_profile_section(tmp_path):
    out = tmp_path / "p.yaml"
    assert runner.invoke(cli.app, ["calibrate", "--gpu", "a100", "--model", "9b", "--out",
                                   str(out), "--no-plot", "--kv", "1024",
                                   "--batch", "1"]).exit_code == 0
    out.write_text(out.read_text() + "extra:\n" + "".join("  " + ln + "\n"
                                                          for ln in BOMB.splitlines()))
    bad("calibrate", "--gpu", "a100", "--model", "9b", "--out", str(out), "--no-plot",
        culprit="YAML aliases expand")


def test_recursive_alias_and_small_aliases():
    with pytest.raises(InputError, match="refers to itself"):
        files.parse_yaml("a: &a [1, *a]\n", "x.yaml")
    # aliases that add little are fine: the shared value is read twice
    assert files.parse_yaml("a: &x {b: 1}\nc: *x\n", "x.yaml") == {"a": {"b": 1}, "c": {"b": 1}}


# ---- numbers: too long, too big, too deep ----------------------------------------------
def test_5000_digit_integers(tmp_path):
    huge = "9" * 5000
    bad("inspect-tree", tree_file(tmp_path, f'{{"parents": [-1, {huge}], "log_probs": [-1, -1]}}',
                                  "t.json"), culprit="node 1: parent inf")
    bad("inspect-tree", tree_file(tmp_path, f"parents: [-1, {huge}]\nlog_probs: [-1, -1]\n"),
        culprit="node 1: parent inf")
    cfg = json.loads(CONFIG_9B.read_text())
    cfg["text_config"]["hidden_size"] = huge  # JSON text below, not a Python int
    text = json.dumps(cfg).replace(f'"{huge}"', huge)
    (tmp_path / "config.json").write_text(text)
    bad("models", str(tmp_path / "config.json"), culprit="'text_config.hidden_size' must be an integer, got a "
                                                          "number too large (over 20 digits)")


def test_400_digit_log_prob_and_profile_numbers(tmp_path):
    big = "1" + "0" * 400
    bad("inspect-tree", tree_file(tmp_path, f"parents: [-1]\nlog_probs: [-{big}]\n"),
        culprit="node 0: log-prob")
    bad("inspect-tree", tree_file(tmp_path, f"parents: [-1]\nlog_probs: [{big}]\n"),
        culprit="node 0: log-prob")
    from bole_cli.profiles import load_profile

    good = DATA.parent.parent / "profiles" / "a100" / "Qwen3.5-9B.yaml"
    data = yaml.safe_load(good.read_text())
    for where in ("t_dec", "eps"):
        d = json.loads(json.dumps(data))
        if where == "eps":
            d["eps"] = "BIG"
        else:
            d["configs"][0]["t_dec"] = "BIG"
        p = tmp_path / f"{where}.yaml"
        p.write_text(yaml.safe_dump(d).replace("BIG", big))
        with pytest.raises(InputError, match=rf"{where}: expected a finite number, got inf"):
            load_profile(p)
        bad("serve", "--model", "9b", "--gpu", "a100", "--profile", str(p), "--dry-run",
            culprit=where)


@pytest.mark.parametrize("name,text", [
    ("deep.json", "[" * 5000 + "]" * 5000),
    ("deep2.json", "[" * 100 + "]" * 100),
    ("deep.yaml", "[" * 5000 + "]" * 5000),
    ("deep2.yaml", "a:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(100))),
])
def test_deep_nesting(tmp_path, name, text):
    bad("inspect-tree", tree_file(tmp_path, text, name), culprit="nested")


# ---- files that are not plain text files -----------------------------------------------
def test_symlink_loop_binary_directory_empty(tmp_path):
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(tmp_path / "loop.yaml")
    bad("inspect-tree", str(loop), culprit="symbolic link loop")
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\x7fELF\x00\x01\x02")
    bad("inspect-tree", str(binary), culprit="b.yaml: is a binary file")
    bad("inspect-tree", str(tmp_path), culprit="is a directory")
    bad("inspect-tree", "", culprit="empty path")
    bad("inspect-tree", "--sglang", "", culprit="--sglang: an empty path")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root reads any file")
def test_unreadable_file(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("parents: [-1]\nlog_probs: [-1]\n")
    p.chmod(0)
    bad("inspect-tree", str(p), culprit="permission denied")


def test_unreadable_file_by_a_fake(tmp_path, monkeypatch):
    p = tmp_path / "t.yaml"
    p.write_text("parents: [-1]\nlog_probs: [-1]\n")
    real_open = os.open

    def deny(path, *a, **k):
        if str(path) == str(p):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(files.os, "open", deny)
    with pytest.raises(InputError, match="t.yaml: permission denied"):
        files.read_text(p)


def _subprocess_bad(args: list[str], culprit: str) -> None:
    """A file that could hang an in-process reader is tried in a subprocess."""
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "bole_cli", *args], capture_output=True,
                       text=True, timeout=30)
    assert time.perf_counter() - start < 15  # startup on a loaded machine; a hang is 30 s
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0], r.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_fifo_and_dev_zero(tmp_path):
    fifo = tmp_path / "t.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is a FIFO"):  # in-process: O_NONBLOCK, no hang
        files.read_text(fifo)
    if os.path.exists("/dev/zero"):
        with pytest.raises(InputError, match="is a device"):
            files.read_text("/dev/zero")
    _subprocess_bad(["inspect-tree", str(fifo)], "is a FIFO, not a regular file")


def test_size_cap(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text("x" * 2000)
    with pytest.raises(InputError, match="larger than"):
        files.read_text(p, max_bytes=1000)


# ---- config.json ----------------------------------------------------------------------
def _config(tmp_path: Path, **changes) -> str:
    cfg = json.loads(CONFIG_9B.read_text())
    text = cfg.get("text_config", cfg)
    for k, v in changes.items():
        if v is None:
            text.pop(k, None)
        else:
            text[k] = v
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path / "config.json")


def test_config_without_gdn_layers(tmp_path):
    llama = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
             "intermediate_size": 11008}
    (tmp_path / "config.json").write_text(json.dumps(llama))
    for args in (["models"], ["inspect-tree", "--synthetic", "--model"],
                 ["calibrate", "--gpu", "a100", "--no-plot", "--model"]):
        bad(*args, str(tmp_path / "config.json"), culprit="not a hybrid GDN model")
    n = json.loads(CONFIG_9B.read_text())["text_config"]["num_hidden_layers"]
    path = _config(tmp_path, layer_types=["full_attention"] * n)
    bad("models", path, culprit="not a hybrid GDN model")


def test_config_head_dim_and_absurd_layers(tmp_path):
    bad("models", _config(tmp_path, head_dim=None, hidden_size=8, num_attention_heads=16),
        culprit="give 'head_dim'")
    bad("models", _config(tmp_path, num_hidden_layers=10 ** 18, layer_types=None,
                          full_attention_interval=4),
        culprit="num_hidden_layers")


# ---- calibrate: options checked before the sweep ----------------------------------------
@pytest.mark.parametrize("flag,value,culprit", [
    ("--kv", "1" + "0" * 400, "--kv"),
    ("--grid", "8,16,1" + "0" * 400, "--grid"),
    ("--batch", "9" * 5000, "--batch"),
    ("--eps", "inf", "--eps"),
    ("--eps", "nan", "--eps"),
])
def test_calibrate_options_fail_before_any_work(tmp_path, monkeypatch, flag, value, culprit):
    import bole_cli.calibrate.sweep as sweep

    def no_sweep(*a, **k):
        raise AssertionError("the sweep ran")

    monkeypatch.setattr(sweep, "run_sweep", no_sweep)
    out = tmp_path / "p.yaml"
    line = bad("calibrate", "--gpu", "a100", "--model", "9b", "--out", str(out), flag, value,
               culprit=culprit)
    assert "got a number" not in line and not out.exists()


def test_an_estimate_for_a_model_that_fits_no_cell_of_the_gpu_is_refused(tmp_path, monkeypatch):
    """397B's weights alone are five H200s: the estimate would price a GPU that cannot hold
    it, so it is refused naming --model before the sweep."""
    import bole_cli.calibrate.sweep as sweep

    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("the sweep ran")))
    out = tmp_path / "p.yaml"
    line = bad("calibrate", "--gpu", "h200", "--model", "397b", "--out", str(out), "--estimate",
               culprit="--model 397b: its weights need")
    assert "; one H200 SXM has 131 GiB, and Bole calibrates one GPU" in line and not out.exists()
    bad("calibrate", "--gpu", "a100", "--model", "80b", "--out", str(out), culprit="--model 80b")
    # the weights fit; the smallest cell's cache and its smallest verify (a chain of one
    # draft, 2 tokens) do not: no cell would have an entry, and the cell's options are named
    line = bad("calibrate", "--gpu", "a100", "--model", "27b", "--batch", "1,4", "--kv", "380000,500000",
               "--out", str(out), culprit="--kv: the smallest cell, batch 1 over 380,000 cached tokens")
    assert "to verify 2 tree tokens (weights 50.1 GiB, kv_cache 23.2 GiB" in line and not out.exists()
    line = bad("calibrate", "--gpu", "a100", "--model", "27b", "--batch", "2", "--kv", "380000",
               "--out", str(out), culprit="--batch/--kv: the smallest cell, batch 2 over 380,000")
    # the GDN states grow with the batch alone: a cache of one token still does not fit,
    # and the largest part is named, whatever it is
    line = bad("calibrate", "--gpu", "h100", "--model", "9b", "--batch", "1500", "--kv", "1",
               "--grid", "2048", "--out", str(out), culprit="--batch: the smallest cell, batch 1500 over 1 cached token,")
    assert "(gdn_states 70.3 GiB, weights 16.7 GiB" in line
    # a few MiB over: the two sizes are told apart
    line = bad("calibrate", "--gpu", "h100", "--model", "27b", "--kv", "346500", "--batch", "1",
               "--out", str(out), culprit="--kv")
    assert "needs 74.519 GiB" in line and "has 74.506 GiB" in line


def test_a_gpu_named_as_another_part_of_a_catalogue_family_is_refused(tmp_path):
    """A 40 GB A100 or a PCIe H100 is not the catalogue's SXM part: priced as it, the
    estimate's memory check would pass what cannot fit, so the name is refused."""
    from bole_cli.catalog.hardware import resolve_gpu

    out = str(tmp_path / "p.yaml")
    line = bad("calibrate", "--estimate", "--gpu", "A100 40GB", "--model", "9b", "--out", out,
               culprit="--gpu: 'A100 40GB' is a 40 GB card; the catalogue's a100 is the A100 SXM4 80GB")
    bad("calibrate", "--estimate", "--gpu", "NVIDIA H100 PCIe", "--model", "9b", "--out", out,
        culprit="is a PCIe card")
    bad("calibrate", "--estimate", "--gpu", "NVIDIA H200 NVL", "--model", "9b", "--out", out,
        culprit="is an NVL card")
    bad("calibrate", "--estimate", "--gpu", "h999", "--model", "9b", "--out", out,
        culprit="--gpu: unknown GPU 'h999'; known: a100, h100, h200")
    assert "would not apply" in line and not (tmp_path / "p.yaml").exists()
    # the names torch reports for the catalogue parts themselves still resolve
    for name, key in (("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
                      ("NVIDIA H200", "h200"), ("NVIDIA GB10", "gb10"), ("h200-sxm", "h200"),
                      ("NVIDIA B200", "b200"), ("B200 192GB", "b200"),  # 192 quoted, 180 usable
                      ("NVIDIA H200 141GB HBM3e", "h200"),
                      ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "a100")):  # a MIG slice's size
        assert resolve_gpu(name).key == key
    with pytest.raises(InputError, match="--efficiency-from: 'A100 40GB' is a 40 GB card"):
        resolve_gpu("A100 40GB", "--efficiency-from")


# ---- output paths --------------------------------------------------------------------
def test_no_command_writes_over_the_repositorys_records(tmp_path, monkeypatch):
    """A user's run goes to the user's space: calibrate's plot, inspect-tree's plot and
    acceptance's file would each have replaced a committed record in experiments/ (a
    bad-input sweep found the tracked calibrate PNG overwritten), and anything under the
    shipped profiles/ is refused, whichever command writes it."""
    import bole_cli.calibrate.sweep as sweep
    from bole_cli.paths import repository_experiments
    from bole_cli.profiles import shipped_profiles_dir

    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("the sweep ran")))
    profiles, experiments = shipped_profiles_dir(), repository_experiments()
    assert experiments is not None  # the tests run in a checkout
    record = experiments / "results" / "calibrate-h200-qwen3.5-9b.png"
    assert record.is_file()
    before = record.read_bytes()
    # the profile's name is new; its plot beside it is a record
    fresh = experiments / "results" / "calibrate-h200-qwen3.5-9b.yaml"
    assert not fresh.exists()
    bad("calibrate", "--estimate", "--gpu", "h200", "--model", "9b", "--out", str(fresh),
        culprit="--out (its plot): ")
    line = bad("inspect-tree", tree_file(tmp_path, "parents: [-1, 0]\nlog_probs: [0, -1]\n"),
               "--plot", str(record), culprit="--plot: ")
    assert "is one of the repository's records" in line and record.read_bytes() == before
    bad("inspect-tree", tree_file(tmp_path, "parents: [-1, 0]\nlog_probs: [0, -1]\n"),
        "--plot", str(profiles / "tree.png"), culprit="is in the shipped profiles")
    assert not fresh.exists() and not (profiles / "tree.png").exists()
    # a new file in experiments/ is the team's to add (bench's --out-dir experiments/results)
    from bole_cli.console import check_not_a_record, check_writable

    check_writable(experiments / "results" / "a-new-record.json", "--out-dir")
    # bench's own names: the device names the stem, checked before any timing
    tiny = experiments / "results" / "e2e-cpu-tiny.json"
    assert tiny.is_file()
    before = tiny.read_bytes()
    r = runner.invoke(cli.app, ["bench", "e2e", "--tiny", "--device", "cpu", "--out-dir",
                                str(experiments / "results")])
    assert r.exit_code == 2 and "--out-dir: " in r.stderr and "e2e-cpu-tiny.json is one of the" in r.stderr
    r = runner.invoke(cli.app, ["bench", "e2e", "--tiny", "--device", "cpu", "--out-dir",
                                str(experiments / "results"), "--tag", "e2e-cpu-tiny"])
    assert r.exit_code == 2 and "--tag: " in r.stderr
    assert tiny.read_bytes() == before
    # an installed wheel's shipped profiles (under sys.prefix, writable in a venv) too
    wheel = tmp_path / "share" / "bole" / "profiles"
    (wheel / "h100").mkdir(parents=True)
    import bole_cli.paths as paths

    monkeypatch.setattr(paths, "shipped_profiles_dir", lambda: wheel)
    with pytest.raises(InputError, match="is in the shipped profiles"):
        check_not_a_record(wheel / "h100" / "Qwen3.5-9B.yaml", "--out")


def test_timing_options_and_a_plot_folder_are_named_with_their_value(tmp_path):
    args = ["calibrate", "--gpu", "h100", "--model", "9b", "--out", str(tmp_path / "p.yaml")]
    bad(*args, "--repeats", "0", culprit="--repeats: expected an integer >= 1, got 0")
    bad(*args, "--warmup", "-1", culprit="--warmup: expected an integer >= 0, got -1")
    bad("inspect-tree", tree_file(tmp_path, "parents: [-1, 0]\nlog_probs: [0, -1]\n"), "--plot",
        str(tmp_path), culprit=f"--plot: {tmp_path} is a directory")


def test_acceptance_names_an_empty_value_a_profile_and_takes_a_preset_in_any_case(tmp_path):
    """'' read as the working folder ('.: is a directory'), a calibration profile as a list
    of unknown fields, and paper-MBPP was refused where --gpu H200 is not."""
    from bole_cli.calibrate.acceptance import load_acceptance
    from bole_cli.profiles import shipped_profiles_dir

    args = ["calibrate", "--estimate", "--gpu", "h100", "--model", "9b", "--out", str(tmp_path / "p.yaml")]
    bad(*args, "--acceptance", "", culprit="--acceptance: an empty value; give a preset")
    shipped = shipped_profiles_dir() / "h100" / "Qwen3.5-9B.yaml"
    bad(*args, "--acceptance", str(shipped),
        culprit="is a calibration profile, not an acceptance file (it was calibrated with 'paper-mbpp')")
    assert load_acceptance("PAPER-MBPP").describe() == load_acceptance("paper-mbpp").describe()


def test_a_presets_name_in_the_working_folder_does_not_shadow_the_preset(tmp_path, monkeypatch):
    """`--acceptance paper-mbpp` is the default: a folder or file of that name in the
    working folder must not break a run that never gave the option (a preset wins over a
    file of its name, as a catalogue model does); any case still finds the preset, and the
    end-to-end bench reads the preset as calibrate does (its top-1 row included)."""
    from bole_cli.bench.e2e.simulated_acceptance import load_e2e_acceptance
    from bole_cli.calibrate.acceptance import load_acceptance

    monkeypatch.chdir(tmp_path)
    (tmp_path / "paper-mbpp").mkdir()
    (tmp_path / "paper-cnndm").write_text("x: 1\n")
    assert load_acceptance("paper-mbpp").describe()["name"] == "paper-mbpp"
    assert load_acceptance("paper-cnndm").describe()["name"] == "paper-cnndm"
    assert load_e2e_acceptance("PAPER-MBPP") == load_e2e_acceptance("paper-mbpp")
    r = runner.invoke(cli.app, ["calibrate", "--estimate", "--gpu", "h100", "--model", "9b", "--batch", "1",
                                "--kv", "1024", "--no-plot", "--out", str(tmp_path / "p.yaml"), "--json"])
    assert r.exit_code == 0, r.stderr


def test_unwritable_out_is_refused_first(tmp_path, monkeypatch):
    import bole_cli.calibrate.sweep as sweep

    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("the sweep ran")))
    args = ["calibrate", "--gpu", "a100", "--model", "9b", "--no-plot"]
    if os.path.isdir("/proc/self"):
        bad(*args, "--out", "/proc/x.yaml", culprit="--out: cannot write /proc/x.yaml")
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad(*args, "--out", str(blocker / "p.yaml"), culprit="is not a directory")
    bad(*args, env={"BOLE_CACHE_DIR": str(blocker)}, culprit="default profile")


def test_read_only_dir_by_a_fake(tmp_path, monkeypatch):
    import bole_cli.console as console

    def read_only(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(console.tempfile, "mkstemp", read_only)
    line = bad("calibrate", "--gpu", "a100", "--model", "9b", "--no-plot", "--out",
               str(tmp_path / "p.yaml"), culprit="Read-only file system")
    assert ".tmp" not in line and "p.yaml" in line
    bad("inspect-tree", "--synthetic", "--plot", str(tmp_path / "t.png"),
        culprit="--plot: cannot write")


def test_full_disk_names_the_users_file(tmp_path, monkeypatch):
    import bole_cli.console as console

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(console.os, "fsync", full)
    out = tmp_path / "p.yaml"
    line = bad("calibrate", "--gpu", "a100", "--model", "9b", "--no-plot", "--kv", "1024",
               "--out", str(out), culprit="No space left on device", code=1)
    assert f"cannot write {out}" in line and ".tmp" not in line
    assert list(tmp_path.iterdir()) == []  # no temp file left behind
    with pytest.raises(BoleError, match="p.yaml"):
        console.atomic_write_text(out, "x")


# ---- plots, profiles, messages --------------------------------------------------------
def test_plot_with_math_text_tokens(tmp_path):
    t = tree_file(tmp_path, 'parents: [-1, 0, 0]\nlog_probs: [-0.1, -1, -2]\n'
                            'tokens: ["$$", "$x^", "\\\\frac{"]\n')
    r = runner.invoke(cli.app, ["inspect-tree", t, "--plot", str(tmp_path / "t.png")])
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "t.png").stat().st_size > 0


def test_a_decision_that_names_a_bad_mode_is_refused_naming_the_field(tmp_path):
    good = DATA.parent.parent / "profiles" / "a100" / "Qwen3.5-9B.yaml"
    data = yaml.safe_load(good.read_text())
    data["configs"][0]["decision"]["chosen"]["mode"] = "forest"
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data))
    bad("serve", "--model", "9b", "--gpu", "a100", "--profile", str(p), "--dry-run",
        culprit="configs[0].decision.chosen.mode")
    bad("serve", "--model", "9b", "--gpu", "a100", "--dry-run", "--chain-verify", "fold",
        culprit="--chain-verify")
    # the extra arguments Bole reads, as SGLang's parser would refuse them at launch
    serve = ("serve", "--model", "9b", "--gpu", "a100", "--dry-run", "--")
    for extra in (["--speculative-token-map"], ["--speculative-token-map="],
                  ["--speculative-token-map", "--tp", "2"]):  # no file after it
        bad(*serve, *extra, culprit="--speculative-token-map after `--` needs a value")
    for missing in (tmp_path / "none.pt", "./none.pt", "~/none.pt", "none.pt"):  # not a hub path
        bad(*serve, "--speculative-token-map", str(missing), culprit="none.pt: no such file")
    bad(*serve, "--mamba-ssm-dtype", culprit="--mamba-ssm-dtype after `--` needs a value")
    bad(*serve, "--mamba-ssm-dtype=fp8", culprit="--mamba-ssm-dtype after `--`: 'fp8'")


def test_huge_batches_are_refused(tmp_path):
    bad("inspect-tree", "--synthetic", "--requests", "100000000", culprit="--requests")
    p = tmp_path / "b.json"
    p.write_text(json.dumps([{"parents": [-1], "log_probs": [-1]}] * 5000))
    bad("inspect-tree", str(p), culprit="5000 trees")


def test_long_messages_are_cut():
    r = runner.invoke(cli.app, ["models", "x" * 5000])
    assert r.exit_code == 2
    assert len(r.stderr.strip()) <= cli.MAX_ERROR_CHARS + 10


def test_brief_values():
    from bole_cli.errors import brief

    assert brief(10 ** 5000).startswith("an integer of about 50")
    assert brief("x" * 100).endswith("...") and len(brief("x" * 100)) < 50
    assert brief(list(range(100))) == "a list of 100 items"
    assert brief(3) == "3"


def test_no_stray_files(tmp_path):
    """The writability probe leaves nothing behind."""
    from bole_cli.console import check_writable

    check_writable(tmp_path / "a" / "b.yaml", "--out")
    assert list(tmp_path.iterdir()) == []
    shutil.rmtree(tmp_path, ignore_errors=True)


# ---- lists, combinations, defaults (the CLI sweep of 2026-12-06) --------------------------
E2E_TINY = ("bench", "e2e", "--tiny", "--device", "cpu")


@pytest.mark.parametrize("args, culprit", [
    (("calibrate", "--gpu", "a100", "--model", "9b", "--batch", "1,,4"), "--batch: an empty item"),
    # int() takes these; a user typing them meant something else (or nothing a shell shows)
    (("calibrate", "--gpu", "a100", "--model", "9b", "--batch", "1_000"), "--batch: expected an integer"),
    (("calibrate", "--gpu", "a100", "--model", "9b", "--batch", "+4"), "--batch: expected an integer"),
    (("calibrate", "--gpu", "a100", "--model", "9b", "--kv", "\uff11\uff16"), "--kv: expected an integer"),
    (("calibrate", "--gpu", "a100", "--model", "9b", "--batch", "-4"), "--batch: expected an integer >= 1"),
    (("calibrate", "--gpu", "a100", "--model", "9b", "--kv", "1024,"), "--kv: an empty item"),
    (("tune-kernels", "--dry-run", "--model", "9b,,27b"), "--model: an empty item"),
    (("tune-kernels", "--dry-run", "--nodes", ",16"), "--nodes: an empty item"),
    (E2E_TINY + ("--decoders", "ar,,bole"), "--decoders: an empty item"),
    (("bench", "kernels", "--trees", "random,"), "--trees: an empty item"),
])
def test_a_stray_comma_is_refused_naming_the_option(tmp_path, args, culprit):
    bad(*args, culprit=culprit, env={"BOLE_CACHE_DIR": str(tmp_path)})


@pytest.mark.parametrize("value", ["1_0", "+4", "\uff14", "4.0", "0x4", "4" * 5000 + "x"])
@pytest.mark.parametrize("args, option", [
    (("inspect-tree", "--synthetic"), "--depth"),
    (("calibrate", "--gpu", "a100", "--model", "9b"), "--layers-sample"),
    (("serve", "--model", "9b", "--gpu", "h100", "--dry-run"), "--batch"),
    (E2E_TINY, "--steps"),
])
def test_an_integer_option_takes_what_the_list_options_take(tmp_path, args, option, value):
    line = bad(*args, option, value, culprit=f"'{option}': expected an integer",
               env={"BOLE_CACHE_DIR": str(tmp_path)})
    assert value[:24] in line and len(line) < 200


@pytest.mark.parametrize("args, option", [
    (("inspect-tree", "--synthetic"), "--seed"),
    (("serve", "--model", "9b", "--gpu", "h100", "--dry-run"), "--port"),
    (E2E_TINY, "--depth"),
])
def test_an_integer_past_24_digits_is_refused_not_read_as_another(tmp_path, args, option):
    bad(*args, option, "9" * 25, culprit=f"'{option}': expected an integer of at most 24 digits",
        env={"BOLE_CACHE_DIR": str(tmp_path)})


@pytest.mark.parametrize("args", [("inspect-tree", "--synthetic"), E2E_TINY, ("tune-kernels", "--dry-run")])
@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_is_a_32_bit_one_in_every_command(tmp_path, args, seed):
    bad(*args, "--seed", seed, culprit=f"--seed: expected an integer from 0 to 4,294,967,295, got {int(seed):,}",
        env={"BOLE_CACHE_DIR": str(tmp_path)})


@pytest.mark.parametrize("value", ["1_0", "+1", "nan", "inf", "1e999", "0x1", "\uff10.5", "1,5", "1e"])
@pytest.mark.parametrize("args, option", [
    (("calibrate", "--gpu", "a100", "--model", "9b"), "--eps"),
    (("tune-kernels", "--dry-run"), "--max-minutes"),
])
def test_a_number_option_takes_digits_a_point_and_an_exponent(tmp_path, args, option, value):
    bad(*args, option, value, culprit=f"'{option}': expected a number, got {value!r}",
        env={"BOLE_CACHE_DIR": str(tmp_path)})


@pytest.mark.parametrize("text, number", [("0.05", 0.05), (".5", 0.5), ("5.", 5.0), ("1e-2", 0.01),
                                          ("2E+1", 20.0), ("-3", -3.0), (" 7 ", 7.0), ("1e-300", 1e-300)])
def test_a_number_as_a_user_types_one_is_read(text, number):
    from bole_cli.commands import float_value, int_value

    assert float_value(text) == number
    assert float_value(0.25) == 0.25 and int_value(3) == 3 and int_value(" -12 ") == -12


def test_every_number_option_is_read_as_the_list_options_read_theirs():
    """An integer or float parameter declared with typer.Option (whose int takes '1_000' and
    '+4', its float 'nan' too) instead of commands.int_option / float_option is a slip: this
    lists them."""
    import ast

    import bole_cli.commands as commands

    slips = []
    for path in sorted(Path(commands.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            args = node.args.args[len(node.args.args) - len(node.args.defaults):]
            for arg, default in zip(args, node.args.defaults):
                kind = ast.unparse(arg.annotation) if arg.annotation else ""
                call = ast.unparse(default.func) if isinstance(default, ast.Call) else ""
                for number, option in (("int", "int_option"), ("float", "float_option")):
                    if kind in (number, f"Optional[{number}]", f"{number} | None") and call != option:
                        slips.append(f"{path.name}: {node.name}({arg.arg}) uses {call or 'no option'}")
    assert not slips, slips
    sources = [p.read_text() for p in Path(commands.__file__).parent.glob("*.py")]
    assert any("int_option(" in t for t in sources) and any("float_option(" in t for t in sources)


@pytest.mark.parametrize("extra, culprit", [
    (("--model", "27b"), "--model 27b: --tiny builds its own"),
    (("--tree-budgets", "8", "--budget", "16"), "--budget: --tree-budgets sweeps"),
    (("--no-max-batch", "--max-batch", "8"), "--no-max-batch"),
    (("--no-max-batch", "--probe-nodes", "8"), "--no-max-batch"),
    (("--max-batch", "8"), "--max-batch: the largest-batch search it sets up runs on CUDA only"),
    (("--max-probes", "3", "--probe-nodes", "8"), "--max-probes: the largest-batch search"),
    (("--probe-nodes", "8"), "--probe-nodes: the largest-batch search"),
    (("--steps", "100000000"), "--steps: expected an integer from 1 to 4,096, got 100,000,000"),
    (("--warmup", "5000"), "--warmup: expected an integer from 0 to 4,096"),
    (("--decoders", "ar,chain"), "--decoders chain: SGLang's ReplaySSM kernel needs a GDN key dim of at least 32, "
                                 "and --tiny's is 16"),
    (("--decoders", "ar,bole-chain", "--chain-depths", "5", "--depth", "3"), "--chain-depths: 5 is outside 1..3"),
    (("--tree-budgets", "1"), "--tree-budgets: 1 is smaller than batch 2"),
    (("--budget", "1"), "--budget: 1 is smaller than batch 2"),
])
def test_bench_e2e_combinations_are_refused_before_any_model(tmp_path, monkeypatch, extra, culprit):
    import bole_cli.bench.e2e.sweep as sweep

    monkeypatch.setattr(sweep, "run_e2e", lambda *a, **k: (_ for _ in ()).throw(AssertionError("it ran")))
    bad(*E2E_TINY, *extra, culprit=culprit, env={"BOLE_CACHE_DIR": str(tmp_path)})


def test_bench_e2e_chain_depths_need_a_chain_decoder_to_matter():
    """--chain-depths sets the chain decoders' depths: given without one, it would be
    ignored without a word, so it is refused; with one, a depth past --depth is refused."""
    from bole_cli.bench.e2e.options import check_options

    opts = dict(model="9b", tiny=True, batch=None, context=None, depth=3, topk=None, steps=None, warmup=None,
                chain_depths="5", budget="profile", acceptance="paper-mbpp", tree_budgets=None,
                tree_shapes=None, draft_vocab=None, snapshot_engine="auto", max_batch=256, max_probes=8,
                probe_nodes=None, search=True, dtype="auto", device="cpu", graphs=True, seed=0)
    with pytest.raises(InputError, match="--chain-depths: only chain and bole-chain draft chains"):
        check_options(decoders="ar,bole", **opts)
    with pytest.raises(InputError, match="--chain-depths: 5 is outside 1..3"):
        check_options(decoders="ar,bole-chain", **opts)
    assert check_options(decoders="ar,bole-chain", **{**opts, "chain_depths": "2,3"}).chain_depths == (2, 3)
    assert check_options(decoders="ar,bole", **{**opts, "chain_depths": None}).decoders == ("ar", "bole")


@pytest.mark.parametrize("option, value, culprit", [
    ("--depth", 300, "--depth 300 with --topk 2 drafts 1199 nodes"), ("--depth", 0, "--depth"),
    ("--topk", 0, "--topk"), ("--depth", 64, None), ("--depth", 65, "drafts 259 nodes"),
    ("--context", 1 << 24, None), ("--context", (1 << 24) + 1, "--context: expected an integer from 1 to"),
    ("--context", 0, "--context"), ("--batch", "4097", "--batch"), ("--batch", "4096", None)])
def test_bench_e2e_context_batch_and_tree_are_bounded(option, value, culprit):
    """A --context past any model's window (a typo) fails naming it, not as every
    decoder's allocation error in a run that exits 0; a tree past the kernels' 256 nodes
    names --depth and --topk before any model is built (found by a bad-input sweep)."""
    from bole_cli.bench.e2e.options import check_options

    opts = dict(model="9b", tiny=True, batch=None, context=None, depth=None, topk=None, steps=None,
                warmup=None, chain_depths=None, decoders=None, budget="profile", acceptance="paper-mbpp",
                tree_budgets=None, tree_shapes=None, draft_vocab=None, snapshot_engine="auto",
                max_batch=256, max_probes=8, probe_nodes=None, search=True, dtype="auto", device="cpu",
                graphs=True, seed=0)
    opts[option.lstrip("-")] = value
    if culprit is None:
        check_options(**opts)
    else:
        with pytest.raises(InputError, match=culprit):
            check_options(**opts)


@pytest.mark.parametrize("extra, culprit", [
    (("--dry-run", "--fresh"), "--fresh: only a real tuning run"),
    (("--dry-run", "--max-minutes", "3"), "--max-minutes: only a real tuning run"),
    (("--dry-run", "--profile", "k.yaml"), "--profile: only a real tuning run"),
    (("--dry-run", "--study-db", "s.db"), "--study-db: only a real tuning run"),
    (("--sample", "3"), "--sample: only a dry run"),
    (("--max-minutes", "inf"), "'--max-minutes': expected a number, got 'inf'"),
    (("--max-minutes", "-2"), "--max-minutes: must be a number of minutes above 0, got -2"),
    (("--max-minutes", "0"), "--max-minutes: must be a number of minutes above 0"),
    (("--study-db", "/proc/x.db"), "--study-db: cannot write"),
])
def test_tune_kernels_options_that_do_not_apply_are_refused(tmp_path, extra, culprit):
    if "/proc/x.db" in extra and not os.path.isdir("/proc/self"):
        extra = ("--study-db", str(tmp_path))  # a folder where a file goes
        culprit = "--study-db"
    bad("tune-kernels", *extra, culprit=culprit, env={"BOLE_CACHE_DIR": str(tmp_path)})


def test_tune_kernels_checks_its_profile_before_the_gpu(tmp_path):
    """--profile is merged into after each tuned bucket: a name that is not YAML, a file
    that does not read as a profile, or a shipped profile must fail before any tuning (on
    this CPU machine, before the missing GPU is reported), not after the first bucket."""
    from bole_cli.profiles import shipped_profiles_dir
    from bole_cli.tuning.tables import check_kernels_profile

    env = {"BOLE_CACHE_DIR": str(tmp_path)}
    bad("tune-kernels", "--profile", str(tmp_path / "k.txt"), culprit="--profile: ", env=env)
    broken = tmp_path / "k.yaml"
    broken.write_text("kernels: [unclosed\n")
    bad("tune-kernels", "--profile", str(broken), culprit="; it is not overwritten", env=env)
    bad("tune-kernels", "--profile", str(shipped_profiles_dir() / "h200" / "kernels.yaml"),
        culprit="is in the shipped profiles", env=env)
    # once the GPU is known: another GPU's file is refused before the first bucket
    other = shipped_profiles_dir() / "h100" / "Qwen3.5-9B.yaml"
    with pytest.raises(InputError, match="holds gpu 'h100', not this GPU's 'h200'"):
        check_kernels_profile(other, "--profile", "h200")
    check_kernels_profile(other, "--profile", "h100")
    check_kernels_profile(tmp_path / "new.yaml", "--profile", "h200")


def test_the_default_results_folder_is_named_when_the_cache_cannot_take_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = bad(*E2E_TINY, env={"BOLE_CACHE_DIR": str(blocker)}, culprit="the default results folder")
    assert "--out-dir" not in line


def test_a_users_file_is_named_by_its_option(tmp_path):
    kernels = Path(__file__).resolve().parents[1] / "profiles" / "h200" / "kernels.yaml"
    bad("serve", "--model", "9b", "--profile", str(kernels), "--dry-run", culprit="--profile: ")
    bad("serve", "--model", "9b", "--profile", str(tmp_path), "--dry-run", culprit="--profile: ")
    bad("calibrate", "--gpu", "a100", "--model", "9b", "--acceptance", str(tmp_path), culprit="--acceptance: ")


@pytest.mark.parametrize("flag, value", [("--repeats", "5"), ("--warmup", "1"), ("--layers-sample", "2")])
def test_calibrate_estimate_refuses_the_measurements_options(tmp_path, flag, value):
    bad("calibrate", "--gpu", "a100", "--model", "9b", "--estimate", flag, value,
        culprit=f"{flag}: only a measurement uses it", env={"BOLE_CACHE_DIR": str(tmp_path)})


@pytest.mark.parametrize("flag, value", [("--repeats", "5"), ("--warmup", "1"), ("--layers-sample", "2")])
def test_calibrate_without_the_gpu_refuses_the_measurements_options(tmp_path, monkeypatch, flag, value):
    """Without the named GPU calibrate estimates; an option only a measurement uses would be
    ignored without a word, so it is refused, naming the reason."""
    from bole_cli.catalog import hardware as hw

    monkeypatch.setattr(hw, "detect_gpu", lambda index=None: None)
    bad("calibrate", "--gpu", "a100", "--model", "9b", flag, value,
        culprit=f"{flag}: only a measurement uses it, and this run is the estimate (no A100 present",
        env={"BOLE_CACHE_DIR": str(tmp_path)})


@pytest.mark.parametrize("explicit", [False, True], ids=["default-path", "--out"])
def test_an_estimate_does_not_replace_a_measured_profile(tmp_path, monkeypatch, explicit):
    """A measured profile in the user's cache (or at --out) is what serve picks first; an
    estimate made where that GPU is absent must not replace it without a word."""
    from bole_cli.catalog import hardware as hw

    monkeypatch.setattr(hw, "detect_gpu", lambda index=None: None)
    measured = Path(__file__).resolve().parents[1] / "profiles" / "h200" / "Qwen3.5-9B.yaml"
    target = tmp_path / "profiles" / "h200" / "Qwen3.5-9B.yaml"
    target.parent.mkdir(parents=True)
    target.write_bytes(measured.read_bytes())
    args = ["calibrate", "--gpu", "h200", "--model", "9b", "--no-plot"] + (["--out", str(target)] if explicit else [])
    line = bad(*args, culprit="holds a profile measured on the GPU, which an estimate would replace",
               env={"BOLE_CACHE_DIR": str(tmp_path)})
    assert line.startswith("error: --out:" if explicit else "error: the default profile")
    assert target.read_bytes() == measured.read_bytes()


def test_calibrate_checks_where_a_cut_sweep_would_go_before_it_starts(tmp_path):
    """With a profile at --out, a cut sweep goes to NAME-partial.yaml: another model's file
    there is named before any sweep, not after it."""
    shipped = Path(__file__).resolve().parents[1] / "profiles" / "a100"
    out = tmp_path / "p.yaml"
    out.write_bytes((shipped / "Qwen3.5-9B.yaml").read_bytes())
    (tmp_path / "p-partial.yaml").write_bytes((shipped / "Qwen3.5-27B.yaml").read_bytes())
    bad("calibrate", "--gpu", "a100", "--model", "9b", "--estimate", "--no-plot", "--out", str(out),
        culprit=f"--out: {tmp_path / 'p-partial.yaml'}, where a cut sweep would go, holds Qwen/Qwen3.5-27B")


def test_a_recorded_calibrate_command_pastes_back():
    import shlex

    from bole_cli.calibrate.pipeline import reproduce_command

    line = reproduce_command("H200 SXM", "9b", [1], [1024], [8, 16], 0.123456789, "my acc's.yaml", "--estimate")
    assert shlex.split(line) == ["bole", "calibrate", "--gpu", "H200 SXM", "--model", "9b", "--batch", "1",
                                 "--kv", "1024", "--grid", "8,16", "--eps", "0.123456789",
                                 "--acceptance", "my acc's.yaml", "--estimate"]


@pytest.mark.parametrize("args, flag", [
    (E2E_TINY + ("--out-dir",), "--out-dir"),
    (("bench", "kernels", "--out-dir"), "--out-dir"),
    (("calibrate", "--gpu", "h200", "--model", "9b", "--out"), "--out"),
    (("serve", "--model", "9b", "--gpu", "h200", "--dry-run", "--profile"), "--profile"),
    (("acceptance", "--model", "m", "--prompts", "p.jsonl", "--out"), "--out"),
    (("tune-kernels", "--dry-run", "--report"), "--report"),
    (("tune-kernels", "--dry-run", "--study-db"), "--study-db"),
    (("tune-kernels", "--dry-run", "--profile"), "--profile"),
])
def test_an_empty_path_is_named_not_read_as_the_working_folder(tmp_path, monkeypatch, args, flag):
    """'' reaches typer's Path as '.', the working folder (a checkout's root: results were
    written there): every path option refuses it, naming itself."""
    monkeypatch.chdir(tmp_path)
    bad(*args, "", culprit=f"'{flag}': an empty path was given", env={"BOLE_CACHE_DIR": str(tmp_path / "c")})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra, culprit", [
    (("--draft-model", ""), "--draft-model: an empty path"),
    (("--kv-len", "99999999999999"), "--kv-len: expected an integer from 1 to 16,777,216"),
])
def test_serve_refuses_an_empty_draft_model_and_an_absurd_context(extra, culprit):
    bad("serve", "--model", "9b", "--gpu", "h200", "--dry-run", *extra, culprit=culprit)


def test_serve_names_an_unreadable_profile_it_passed_over(tmp_path):
    """A user's broken profile in the cache is skipped for the shipped one, and said so."""
    mine = tmp_path / "profiles" / "a100" / "Qwen3.5-9B.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("bole_profile: [\n")
    r = runner.invoke(cli.app, ["serve", "--model", "9b", "--gpu", "a100", "--dry-run", "--json"],
                      env={"BOLE_CACHE_DIR": str(tmp_path)})
    assert r.exit_code == 0, r.stderr
    notes = json.loads(r.stdout)["notes"]
    assert any(n.startswith(f"passed over an unreadable profile: {mine}: not valid YAML") for n in notes), notes
    alone = tmp_path / "profiles" / "b200" / "Qwen3.5-9B.yaml"  # no shipped profile to fall back on
    alone.parent.mkdir()
    alone.write_text("bole_profile: [\n")
    bad("serve", "--model", "9b", "--gpu", "b200", "--dry-run", code=1, culprit=f"{alone}: not valid YAML",
        env={"BOLE_CACHE_DIR": str(tmp_path)})


@pytest.mark.parametrize("args, culprit", [
    (("tune-kernels", "--dry-run", "--batch", "99999999"), "--batch: expected"),
    (("tune-kernels", "--dry-run", "--trials", "100000000"), "--trials: expected an integer from 1 to 1,000"),
    (("bench", "kernels", "--batch", "99999999"), "--batch: expected"),
])
def test_kernel_commands_bound_batch_and_trials(tmp_path, args, culprit):
    bad(*args, culprit=culprit, env={"BOLE_CACHE_DIR": str(tmp_path)})


def test_inspect_tree_names_the_per_request_options_that_contradict():
    bad("inspect-tree", "--synthetic", "--requests", "3", "--budget", "40", "--max-per-request", "2",
        "--min-per-request", "4", culprit="--max-per-request: 2 is smaller than --min-per-request (4)")


def test_serve_takes_sglangs_arguments_only_after_the_separator():
    bad("serve", "--model", "9b", "--gpu", "a100", "--dry-run", "extra", culprit="'extra': SGLang's launch_server "
        "arguments go after `--`")
    r = runner.invoke(cli.app, ["serve", "--model", "9b", "--gpu", "a100", "--dry-run", "--json", "--", "--foo", "1"])
    assert r.exit_code == 0 and json.loads(r.stdout)["command"][-2:] == ["--foo", "1"]
