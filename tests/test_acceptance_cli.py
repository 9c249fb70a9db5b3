"""`bole acceptance` on the command line (issue 19): the workflow (measure, calibrate with
the file, serve from that profile; bench e2e reads the file), `--json`, bad input as one line
with exit 2, and the acceptance file's hardened reading."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("transformers")

from bole_cli import cli  # noqa: E402
from bole_cli.calibrate.acceptance import from_data, load_acceptance  # noqa: E402
from bole_cli.errors import InputError  # noqa: E402
from test_acceptance import make_checkpoint, write_prompts  # noqa: E402

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()


def invoke(*args):
    return runner.invoke(cli.app, [str(a) for a in args])


def one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield make_checkpoint(tmp_path_factory.mktemp("ck"), "qwen3_next", seed=3)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def measured(ckpt, tmp_path_factory):
    """One CLI run whose file the workflow tests read."""
    d = tmp_path_factory.mktemp("run")
    prompts = write_prompts(d / "prompts.jsonl", ["Hello there", "one two three"])
    out = d / "acc.yaml"
    r = invoke("acceptance", "--model", ckpt, "--prompts", prompts, "--depth", 3, "--topk", 2,
               "--max-new", 12, "--device", "cpu", "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout), out, prompts


def test_json_and_file(measured, ckpt):
    data, out, prompts = measured
    assert data["path"] == str(out) and Path(data["plot"]).stat().st_size > 1000
    doc = yaml.safe_load(out.read_text())
    assert doc == data["acceptance"]
    m = doc["measurement"]
    assert m["checkpoint"] == str(ckpt.resolve()) and m["model_type"] == "qwen3_next"
    assert m["prompts"]["count"] == 2 and len(m["prompts"]["sha256"]) == 64
    assert m["anchors"] == 2 * (12 - 3 + 1) == m["trials"][0]
    assert len(doc["per_depth_rank"]) == 3 and len(doc["per_depth_rank"][0]) == 2
    assert m["partial"] is False and "bole acceptance --model" in m["command"]
    assert set(doc["expected"]["trees"]) >= {"8", "16", "128"}


def test_the_text_view_fits_80_columns(ckpt, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", ["Hello"])
    r = runner.invoke(cli.app, ["acceptance", "--model", str(ckpt), "--prompts", str(prompts),
                                "--depth", "2", "--max-new", "6", "--device", "cpu",
                                "--out", str(tmp_path / "a.yaml"), "--no-plot"],
                      env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    assert "q[d][r]" in r.stdout and "chain of 2, measured" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    assert not (tmp_path / "a.png").exists()
    hint = "\n".join(r.stdout.splitlines()[r.stdout.splitlines().index("next:") + 1:])
    assert shlex.split(hint.replace("\\\n", "")) == [  # the checkpoint named; a CPU run leaves GPU to fill
        "bole", "calibrate", "--gpu", "GPU", "--model", str(ckpt.resolve()), "--acceptance", str(tmp_path / "a.yaml")]


def test_no_plot_says_the_plot_beside_the_file_is_an_earlier_runs(ckpt, tmp_path):
    """An acceptance file rewritten with --no-plot: a note says the plot beside it is an
    earlier run's; the plot is left alone."""
    prompts = write_prompts(tmp_path / "p.jsonl", ["Hello"])
    args = ["acceptance", "--model", str(ckpt), "--prompts", str(prompts), "--depth", "2", "--max-new", "4",
            "--device", "cpu", "--out", str(tmp_path / "a.yaml"), "--json"]
    assert runner.invoke(cli.app, args).exit_code == 0 and (tmp_path / "a.png").exists()
    r = runner.invoke(cli.app, args + ["--no-plot"])
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "a.png").exists()
    assert any("a.png is an earlier run's plot" in n for n in json.loads(r.stdout)["notes"])


def test_the_next_command_names_the_gpu_it_ran_on():
    from bole_cli.commands.acceptance import _next_command

    m = {"device": "NVIDIA H200", "checkpoint": "/ck"}
    assert _next_command(m, "a.yaml")[2:6] == ["--gpu", "h200", "--model", "/ck"]
    assert _next_command({**m, "device": "Some Unknown GPU"}, "a.yaml")[3] == "GPU"


def test_workflow_calibrate_serve_and_bench_read_the_file(measured, tmp_path, monkeypatch):
    import bole_cli.catalog.hardware as hw
    from bole_cli.bench.e2e.simulated_acceptance import load_e2e_acceptance

    _, out, _ = measured
    monkeypatch.setattr(hw, "detect_gpu", lambda index=None: None)
    prof_path = tmp_path / "prof.yaml"
    r = invoke("calibrate", "--gpu", "a100", "--model", "9b", "--batch", "1,8", "--kv", "4096",
               "--acceptance", out, "--out", prof_path, "--no-plot", "--json")
    assert r.exit_code == 0, r.stderr
    acc = json.loads(r.stdout)["profile"]["acceptance"]
    assert acc["name"] == yaml.safe_load(out.read_text())["name"]
    assert acc["measured"]["prompts_sha256"] == yaml.safe_load(out.read_text())[
        "measurement"]["prompts"]["sha256"]
    r = invoke("serve", "--model", "9b", "--gpu", "a100", "--profile", prof_path, "--dry-run",
               "--json")
    assert r.exit_code == 0, r.stderr
    settings = json.loads(r.stdout)["settings"]
    decided = json.loads(r.stdout)["settings"]["predicted"]
    assert settings["mode"] == decided["mode"]  # the decision, within the file's shape:
    assert settings["mode"] == "none" or (settings["num_steps"] <= 3
                                          and settings["eagle_topk"] <= 2)
    e2e = load_e2e_acceptance(str(out))  # zeros (ranks never hit) read as 1e-12
    assert len(e2e.rows(3, 2)) == 3 and all(p > 0 for row in e2e.rows(3, 2) for p in row)


# ---- bad input: one line, exit 2, checked before any weight is read -----------------------
def _no_gdn(tmp_path):
    d = tmp_path / "dense"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": 2,
                                               "hidden_size": 32, "vocab_size": 100}))
    return d


def _copy_without(ckpt, tmp_path, *names):
    import shutil

    d = tmp_path / "partial"
    shutil.copytree(ckpt, d)
    for n in names:
        (d / n).unlink()
    return d


@pytest.mark.parametrize("case, expect", [
    ("no_gdn", "no Gated DeltaNet"),
    ("no_mtp", "no mtp.* weights"),
    ("no_tokenizer", "no tokenizer"),
    ("missing_model", "not found"),
    ("empty_prompts", "no prompts"),
    ("bad_json", "p.jsonl:2: not valid JSON"),
    ("missing_prompts", "--prompts: "),
    ("bad_field", "p.jsonl:1: expected an object with 'prompt'"),
    ("prompts_dir", "is a directory"),
    ("depth", "--depth"),
    ("max_new", "--max-new (2) must be at least --depth (3)"),
    ("cuda", "--device cuda: no CUDA device"),
    ("out_suffix", "--out"),
    ("out_unwritable", "--out: cannot write"),
    ("plot_is_a_folder", "--out (its plot): "),
    ("out_foreign", "is not an acceptance file that `bole acceptance` measured, so it is not overwritten"),
    ("out_histogram", "is not an acceptance file that `bole acceptance` measured"),
    ("messages_no_template", "p.jsonl:1: cannot tokenize"),
])
def test_bad_input_is_one_line(case, expect, ckpt, tmp_path):
    model, prompts = ckpt, write_prompts(tmp_path / "p.jsonl", ["Hello"])
    extra = ["--depth", "3", "--max-new", "8", "--device", "cpu"]
    if case == "no_gdn":
        model = _no_gdn(tmp_path)
    elif case == "no_mtp":
        model = _copy_without(ckpt, tmp_path, "model-mtp.safetensors")
    elif case == "no_tokenizer":
        model = _copy_without(ckpt, tmp_path, "tokenizer.json")
    elif case == "missing_model":
        model = tmp_path / "nowhere"
    elif case == "empty_prompts":
        prompts.write_text("\n  \n")
    elif case == "missing_prompts":
        prompts = tmp_path / "nowhere.jsonl"
    elif case == "bad_json":
        prompts.write_text('{"prompt": "ok"}\n{"prompt": \n')
    elif case == "bad_field":
        prompts.write_text('{"text": 3}\n')
    elif case == "prompts_dir":
        prompts = tmp_path
    elif case == "depth":
        extra[1] = "0"
    elif case == "max_new":
        extra[3] = "2"
    elif case == "cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
        extra[5] = "cuda"
    elif case == "out_suffix":
        extra += ["--out", str(tmp_path / "a.txt")]
    elif case == "out_unwritable":
        extra += ["--out", "/proc/bole/a.yaml"]
    elif case == "plot_is_a_folder":  # found only after the whole measurement, before
        (tmp_path / "b.png").mkdir()
        extra += ["--out", str(tmp_path / "b.yaml")]
    elif case == "out_foreign":  # a user's other YAML file is left alone
        (tmp_path / "notes.yaml").write_text("shopping: [milk]\n")
        extra += ["--out", str(tmp_path / "notes.yaml")]
    elif case == "out_histogram":  # a server's histogram reads as acceptance, but it is input data
        (tmp_path / "notes.yaml").write_text("shopping: [milk]\n")
        (tmp_path / "hist.yaml").write_text("accepted_length_histogram: [10, 20, 30]\n")
        extra += ["--out", str(tmp_path / "hist.yaml")]
    elif case == "messages_no_template":  # the tiny tokenizer has no chat template
        prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    r = invoke("acceptance", "--model", model, "--prompts", prompts, *extra)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert expect in one_line(r)
    assert not list(tmp_path.glob("acceptance-*.yaml")) and not (tmp_path / "b.yaml").exists()
    if case in ("out_foreign", "out_histogram"):
        assert (tmp_path / "notes.yaml").read_text() == "shopping: [milk]\n"
    if case == "out_histogram":
        assert (tmp_path / "hist.yaml").read_text() == "accepted_length_histogram: [10, 20, 30]\n"


def test_the_default_file_goes_to_the_cache_not_the_working_directory(ckpt, tmp_path, monkeypatch):
    """A run without --out in a checkout must not write into the repository."""
    cache, cwd = tmp_path / "cache", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.setenv("BOLE_CACHE_DIR", str(cache))
    monkeypatch.chdir(cwd)
    prompts = write_prompts(tmp_path / "p.jsonl", ["Hello there"])
    r = invoke("acceptance", "--model", ckpt, "--prompts", prompts, "--depth", 2, "--topk", 2,
               "--max-new", 4, "--device", "cpu", "--no-plot", "--json")
    assert r.exit_code == 0, r.stderr
    path = Path(json.loads(r.stdout)["path"])
    assert path.parent == cache / "acceptance" and path.is_file()
    assert not list(cwd.iterdir())
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("BOLE_CACHE_DIR", str(blocker))
    r = invoke("acceptance", "--model", ckpt, "--prompts", prompts, "--device", "cpu")
    assert r.exit_code == 2 and "the default acceptance file" in one_line(r)


def test_without_transformers_it_names_the_extra(ckpt, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    prompts = write_prompts(tmp_path / "p.jsonl", ["Hello"])
    r = invoke("acceptance", "--model", ckpt, "--prompts", prompts)
    # a missing optional dependency exits 1, as `bole serve` without SGLang does
    assert r.exit_code == 1 and 'pip install "transformers<6,>=5.24" "safetensors>=0.4"' in one_line(r)


def test_help_path_imports_no_transformers():
    code = ("import sys, bole_cli.cli; bad = [m for m in ('transformers', 'safetensors', "
            "'torch') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- the acceptance file: hardened reading, checked measurement --------------------------
@pytest.mark.parametrize("kind, expect", [
    ("loop", "symbolic link loop"),
    ("binary", "binary"),
    ("fifo", "FIFO"),
    ("device", "device"),
    ("directory", "directory"),
    ("unreadable", "permission denied"),
])
def test_acceptance_file_reading_is_hardened(kind, expect, tmp_path):
    path = tmp_path / "acc.yaml"
    if kind == "loop":
        os.symlink(tmp_path / "b.yaml", path)
        os.symlink(path, tmp_path / "b.yaml")
    elif kind == "binary":
        path.write_bytes(b"per_depth: [0.9]\x00\xff\xfe")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    elif kind == "directory":
        path = tmp_path
    elif kind == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        path.write_text("per_depth: [0.9]\n")
        path.chmod(0)
    with pytest.raises(InputError, match=expect) as info:
        load_acceptance(str(path))
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_measurement_block_must_agree_with_the_matrix(measured):
    _, out, _ = measured
    doc = yaml.safe_load(out.read_text())
    assert from_data(doc, "a.yaml").measured["anchors"] == doc["measurement"]["anchors"]
    bad = json.loads(json.dumps(doc))
    bad["measurement"]["counts"][0][0] = bad["measurement"]["trials"][0] + 1
    with pytest.raises(InputError, match=r"counts\[0\]: more hits than trials"):
        from_data(bad, "a.yaml")
    bad = json.loads(json.dumps(doc))
    bad["per_depth_rank"][0][0] = 0.5 if doc["per_depth_rank"][0][0] != 0.5 else 0.25
    with pytest.raises(InputError, match=r"per_depth_rank\[0\]\[0\].*measurement counts"):
        from_data(bad, "a.yaml")
    bad = json.loads(json.dumps(doc))
    bad["measurement"]["trials"] = bad["measurement"]["trials"][:1]
    with pytest.raises(InputError, match="one entry per depth"):
        from_data(bad, "a.yaml")



def test_nothing_measured_writes_nothing(tmp_path):
    """No full-depth position measured (EOS at once, or Ctrl-C in the first prompt): an
    all-zero matrix would read as 'never accepted' and steer calibrate to no speculation."""
    from bole_cli.errors import BoleError
    from bole_cli.mtp import run
    from bole_cli.mtp.stats import RankTally

    out = tmp_path / "acc.yaml"
    with pytest.raises(BoleError, match="no position was measured"):
        run._finish(None, None, None, "cpu", None, out, RankTally(3, 2), None, False)
    assert not out.exists()
