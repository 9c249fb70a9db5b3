"""Issue 18: every screen fits 80 columns without cutting what matters, flags read as
flags, plots can be matched to the text and read where the data sits, words are right.

Rendered with COLUMNS=80; Rich marks a cut cell with "…", so its absence in the cells
that matter (paths, defaults, shapes, titles) is the check.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from bole_cli import cli

try:  # click < 8.2 mixes stderr into stdout unless told not to
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

ENV = {"COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"}
REPO = Path(__file__).resolve().parents[1]


def show(*args: str, code: int = 0, env: dict | None = None) -> str:
    r = runner.invoke(cli.app, list(args), env={**ENV, **(env or {})}, terminal_width=80)
    assert r.exit_code == code, (r.stdout, r.stderr)
    for line in r.stdout.splitlines():
        assert len(line) <= 80, line
    return r.stdout


def _commands() -> list[list[str]]:
    root = typer.main.get_command(cli.app)
    found = []

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, path + [name])
        else:
            found.append(path)

    walk(root, [])
    return found


@pytest.mark.parametrize("command", _commands(), ids=" ".join)
def test_help_fits_80_columns_and_flags_show_no_type(command):
    text = show(*command, "--help")
    assert "…" not in text, text  # a default or a help text was cut
    assert "<bool>" not in text, text


def test_help_defaults_are_whole():
    text = show("calibrate", "--help")
    assert "1024]" in text  # the end of --grid's default
    assert "~/.cache/bole)" in text  # the end of --out's default
    assert "~/.cache/bole)" in show("tune-kernels", "--help")


def test_serve_dry_run_shows_the_whole_profile_path(tmp_path):
    deep = tmp_path / ("a-rather-long-folder-name-" * 3) / "a100"
    deep.mkdir(parents=True)
    src = REPO / "profiles" / "a100" / "Qwen3.5-9B.yaml"
    (deep / "Qwen3.5-9B.yaml").write_text(src.read_text())
    text = show("serve", "--model", "9b", "--gpu", "a100", "--dry-run", "--batch", "1",
                "--profile", str(deep / "Qwen3.5-9B.yaml"))
    assert "…" not in text
    joined = re.sub(r"[│\s]+", "", text)
    assert re.sub(r"\s+", "", str(deep / "Qwen3.5-9B.yaml")) in joined
    assert re.search(r"x 1 request\b", text)
    assert "1 requests" not in text


def test_tune_kernels_dry_run_shape_column_is_whole():
    from bole_cli.tuning.report import space_table
    from rich.console import Console

    console = Console(width=80, record=True, color_system=None)
    console.print(space_table([{"kernel": "tree_verify", "shape": "H16-HV32-K128-V128",
                                "models": ["Qwen/Qwen3.5-9B"],
                                "space": {"VSPLIT": [1, 2, 4], "BV": [16, 32, 64, 128],
                                          "num_warps": [2, 4, 8]},
                                "size": 288, "default": "VSPLIT4 BV32 BK64 w4 s1"}]))
    text = console.export_text()
    assert "…" not in text
    assert all(len(ln) <= 80 for ln in text.splitlines())
    assert "H16-HV32-K128-V128" in text  # a bucket's name is never split across lines


def test_inspect_tree_words_and_titles():
    text = show("inspect-tree", "--synthetic", "--depth", "8", "--topk", "2", "--budget", "16",
                "--model", "9b", "--batch", "8")
    assert "depth 8 below the verified token" in text
    assert "depth 9" not in text
    # "depth" as --depth means it: draft levels below the verified token, which is d=0
    assert "depth: draft levels below the verified token [0] (as --depth)" in " ".join(
        text.split())
    assert "d=8" in text and "d=9" not in text and "levels" not in text.split("Summary")[1][:200]
    assert "1 request," in text and "1 request(s)" not in text
    assert "8 requests in flight, each verifying up to 16 nodes" in text
    assert "batch 8 x 16 nodes" not in text
    assert "…" not in text
    assert "Transient verify memory: Qwen/Qwen3.5-9B" in text  # a title on one line


def test_calibrate_table_fits(tmp_path):
    text = show("calibrate", "--gpu", "a100", "--model", "9b", "--out",
                str(tmp_path / "p.yaml"), "--no-plot", "--kv", "1024")
    assert "…" not in text


# ---- plots ----------------------------------------------------------------------------
def _captured_figure(monkeypatch):
    import bole_cli.console as console

    seen = {}

    def capture(fig, path):
        seen["fig"] = fig
        return Path(path)

    monkeypatch.setattr(console, "save_figure", capture)
    return seen


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


@pytest.mark.parametrize("depth,topk", [(3, 2), (8, 4)])  # 11 nodes; 117 nodes
def test_tree_plot_has_every_node_id(monkeypatch, tmp_path, depth, topk):
    from bole_cli.inspection.plot import plot_trees
    from bole_cli.trees import beam_tree

    seen = _captured_figure(monkeypatch)
    t = beam_tree(depth, topk, 0)
    plot_trees([t], None, tmp_path / "t.png")
    texts = _texts(seen["fig"])
    assert all(str(i) in texts for i in range(t.n_nodes))


def test_calibrate_plot_gives_room_to_the_knee_band_and_keeps_the_legend_off(monkeypatch,
                                                                              tmp_path):
    from bole_cli.calibrate.plot import plot_profile
    from bole_cli.profiles import load_profile

    seen = _captured_figure(monkeypatch)
    profile = load_profile(REPO / "profiles" / "a100" / "Qwen3.5-9B.yaml")
    plot_profile(profile, tmp_path / "p.png")
    fig = seen["fig"]
    fig.canvas.draw()
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    to_axes = ax.transScale + ax.transLimits  # data -> axes fraction through the scale
    band = (to_axes.transform((1, 1.05))[1] - to_axes.transform((1, 1.0))[1])
    assert band > 0.12, band  # 1.00-1.05 takes a visible share of the height
    ratios = [t / c["t_dec"] for c in profile["configs"] for t in c["t_ver"]]
    assert lo <= min(ratios) and hi >= max(ratios)
    legend = fig.legends[0].get_window_extent()
    for a in fig.axes:
        assert not legend.overlaps(a.get_window_extent())


def test_readme_words():
    text = (REPO / "README.md").read_text()
    assert "85-102x" not in text
    assert "64x" in text
    assert "64x for Qwen3.5-0.8B" in text
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    tests = [p for p in paragraphs if "equivalence tests" in p]
    assert tests and all(".whl/" in p and ".ci/run" in p for p in tests)
    cpu = [p for p in paragraphs if "Run on CPU" in p]
    assert cpu and all(".whl/" in p for p in cpu)


# ---- issue 33: the edges a user hits at 80 columns -------------------------------------

def test_every_command_summary_is_one_paragraph_line():
    """`bole --help` shows a command's first paragraph as it is written: a line break in
    it shows as a break mid-sentence."""
    root = typer.main.get_command(cli.app)
    for name, cmd in root.commands.items():
        first = (cmd.help or "").strip().split("\n\n")[0]
        assert "\n" not in first, (name, first)


def test_flags_take_no_second_help_column():
    """A `--plot/--no-plot` pair gets a column of its own in Rich help, leaving the help
    text about 32 columns: every flag is one name."""
    root = typer.main.get_command(cli.app)

    def walk(cmd, path):
        for sub_name, sub in (getattr(cmd, "commands", None) or {}).items():
            yield from walk(sub, path + [sub_name])
        for p in getattr(cmd, "params", []):
            yield path, p

    for path, p in walk(root, []):
        assert not getattr(p, "secondary_opts", None), (path, p.opts, p.secondary_opts)
    assert len(show("calibrate", "--help").splitlines()) <= 56


def test_serve_command_is_printed_outside_the_panel_to_paste(tmp_path):
    import subprocess

    text = show("serve", "--gpu", "h200", "--model", "9b", "--dry-run")
    after = text[text.rindex("╰"):].splitlines()[1:]  # below the panel's last border line
    # the first line is the environment (BOLE_CHAINS=1 too where the profile decides a chain)
    assert after and after[0].endswith("SGLANG_PLUGINS=bole \\")
    assert not any("│" in ln for ln in after)
    assert all(ln.endswith(" \\") for ln in after[:-1]) and not after[-1].endswith("\\")
    script = tmp_path / "cmd.sh"
    script.write_text("\n".join(after) + "\n")
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert "launch_server" not in text[:text.rindex("╰")]


def test_inspect_tree_summary_depth_is_the_drafts_depth():
    """The Summary's depth column is --depth (draft levels below the verified token), as the
    header and the JSON say, for each request and for all."""
    text = show("inspect-tree", "--synthetic", "--depth", "8", "--topk", "4", "--requests", "2")
    rows = [ln.split("│") for ln in text.split("Summary")[1].splitlines() if "│" in ln]
    assert [r[0].strip() for r in rows] == ["0", "1", "all"]
    assert all(r[2].strip() == "8" for r in rows), rows


def test_inspect_tree_header_keeps_its_pairs_on_one_line():
    text = show("inspect-tree", "--synthetic", "--depth", "8", "--topk", "4", "--seed", "0")
    head = text.splitlines()[:2]
    assert head[0].startswith("synthetic EAGLE-style beam (seed 0): 1 request,")
    assert head[1] == "depth 8 below the verified token [0], top-k 4"


def test_bench_e2e_table_keys_are_left_aligned():
    from bole_cli.bench.e2e import report

    src = Path(report.__file__).read_text()
    assert src.count("caption=") == src.count('caption_justify="left"')


def test_calibrate_plot_marks_the_decision_and_what_it_buys(monkeypatch, tmp_path):
    """Each bucket's decision sits on its curve, labelled with its speedup; a bucket whose
    decision is a chain gets no tree's N* star (the shipped H200 9B profile has chains)."""
    from bole_cli.calibrate.plot import plot_profile
    from bole_cli.profiles import load_profile

    seen = _captured_figure(monkeypatch)
    profile = load_profile(REPO / "profiles" / "h200" / "Qwen3.5-9B.yaml")
    plot_profile(profile, tmp_path / "p.png")
    fig = seen["fig"]
    texts = _texts(fig)
    decided = [(c["decision"]["chosen"], c) for c in profile["configs"]
               if c.get("decision") and c["decision"]["chosen"]["mode"] != "none"]
    assert any(ch["mode"] == "chain" for ch, _ in decided)
    for chosen, _ in decided:
        assert f"{chosen['label']} {chosen['speedup']:.2f}x" in texts
    stars = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_marker() == "*"]
    assert stars == []


# ---- narrower than 80 columns: labels wrap first, figures are never cut ----------------

@pytest.mark.parametrize("width", [60, 66, 72])
@pytest.mark.parametrize("command", [["hardware"], ["models"],
                                     ["calibrate", "--gpu", "h200", "--model", "9b", "--no-plot",
                                      "--batch", "1,16"],
                                     ["calibrate", "--gpu", "a100", "--model", "27b", "--no-plot"]],
                         ids=" ".join)
def test_narrow_terminals_cut_no_figure(command, width, tmp_path):
    """In a split pane the text columns (GPU and model names, the decision) wrap or fold, so
    no cell is cut: a figure such as kv 16384 or a step's 11.4 ms never shows as '163…' or
    '11…', a decision's N=128 never as 'N=1…'."""
    env = {**ENV, "COLUMNS": str(width), "BOLE_CACHE_DIR": str(tmp_path)}
    r = runner.invoke(cli.app, command, env=env, terminal_width=width)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    body = r.stdout.split("─" * 10, 1)[1]  # the table's rows, below its header rule
    assert "…" not in body, body
    if command[0] == "calibrate":
        assert "16384" in r.stdout
