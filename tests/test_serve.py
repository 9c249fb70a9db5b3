"""`bole serve`: settings from profiles, the SGLang command line, and the launch checks.

Runs without SGLang and without a GPU: --gpu names the profile's GPU, the launch itself
(os.execvpe) and the installed-SGLang probe are replaced where a test needs them.
"""

from __future__ import annotations

import json
import shlex
import sys

import pytest
import yaml
from typer.testing import CliRunner

from bole_cli import cli, serving
from bole_cli.commands import serve as serve_cmd
from bole_cli.errors import BoleError, InputError
from bole_cli.profiles import find_profile, load_profile, lookup_budget

try:  # click < 8.2 mixes stderr into stdout unless told not to
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

MODELS = {"4b": "Qwen/Qwen3.5-4B", "9b": "Qwen/Qwen3.5-9B", "27b": "Qwen/Qwen3.5-27B"}


def invoke(*args):
    return runner.invoke(cli.app, ["serve", *args])


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.fixture
def no_sglang(monkeypatch):
    status = {"installed": False, "version": None, "pinned": "0.5.23", "plugin_registered": True}
    monkeypatch.setattr(serving, "sglang_status", lambda: dict(status))
    return status


@pytest.fixture
def fake_sglang(monkeypatch):
    """SGLang 0.5.23 'installed' with the entry point; the exec is captured."""
    status = {"installed": True, "version": "0.5.23", "pinned": "0.5.23", "plugin_registered": True}
    monkeypatch.setattr(serving, "sglang_status", lambda: dict(status))
    launched = []
    monkeypatch.setattr(serve_cmd, "_launch", lambda argv, env, stdout_to_stderr=False: launched.append((argv, env)))
    return status, launched


# ----------------------------------------------------------------- dry run from profiles


@pytest.mark.parametrize("gpu", ["a100", "gb10", "h200"])
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("batch", [1, 4, 16])
def test_dry_run_command_from_shipped_profiles(no_sglang, gpu, model, batch):
    """serve applies the profile's decision for the bucket, and never a tree it did not
    choose: the mode, the flags and the prediction are the decision's."""
    r = invoke("--model", model, "--gpu", gpu, "--batch", str(batch), "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    prof_path = find_profile(gpu, MODELS[model])
    assert res["profile"] == str(prof_path)
    entry, _ = lookup_budget(load_profile(prof_path), batch, serving.DEFAULT_KV_LEN)
    ch = entry["decision"]["chosen"]
    s = res["settings"]
    assert s["mode"] == ch["mode"] and s["predicted"]["tok_s"] == ch["tok_s"]
    assert s["b_ver"] == entry["b_ver"] and ch["label"] in s["why"]
    argv = res["command"]
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert flag(argv, "--model-path") == MODELS[model]
    assert flag(argv, "--max-running-requests") == str(batch)
    assert flag(argv, "--port") == "30000" and "--speculative-draft-model-path" not in argv
    chains = {"BOLE_CHAINS": "1"} if ch["mode"] == "chain" else {}  # Bole's chain path
    assert res["env"] == {"SGLANG_PLUGINS": "bole", **chains}
    assert res["command_line"] == " ".join(
        f"{k}={v}" for k, v in res["env"].items()) + " " + shlex.join(argv)
    assert res["dry_run"] is True and res["sglang"]["installed"] is False
    if ch["mode"] == "none":
        assert "--speculative-algorithm" not in argv and res["memory"] is None
        return
    assert flag(argv, "--speculative-algorithm") == "NEXTN"
    if ch["mode"] == "chain":
        want = (ch["depth"], 1, ch["depth"] + 1)
        assert "--enable-linear-replayssm-spec" not in argv  # Bole's chain by default
    else:
        d = min(max(ch["budget"] // entry["batch"], 2),
                serving.max_tree_tokens(ch["depth"], ch["topk"]), 256)
        want = (min(ch["depth"], d - 1), ch["topk"], d)
    assert (s["num_steps"], s["eagle_topk"], s["num_draft_tokens"]) == want
    assert [flag(argv, f"--speculative-{k}") for k in ("num-steps", "eagle-topk",
                                                       "num-draft-tokens")] == list(map(str, want))
    assert res["memory"]["bole_arena_bytes"] < res["memory"]["sglang_snapshot_bytes"] / 20


def _decided(mode: str, depth: int = 0, topk: int = 0, budget: int = 8) -> dict:
    """A one-bucket profile whose decision is `mode` (the rest as calibrate writes it)."""
    choice = {"mode": mode, "depth": depth, "topk": topk, "budget": budget, "tokens": 10.0,
              "t_draft": 0.001 * depth, "t_verify": 0.01, "t_sample": 1e-4, "verify": "bole",
              "step_s": 0.012, "tok_s": 800.0, "speedup": 1.5,
              "label": {"none": "no speculation", "chain": f"chain d={depth}",
                        "tree": f"tree {depth}x{topk} N={budget}"}[mode]}
    other = dict(choice, mode="none", depth=0, topk=0, budget=4, tok_s=500.0, speedup=1.0,
                 label="no speculation")
    decision = {"mode": mode, "chosen": choice,
                "runner_up": None if mode == "none" else other,
                "best": {mode: choice}, "considered": 3}
    return {"gpu": "h200", "model": "m", "provenance": {"kind": "measured"},
            "acceptance": {"name": "x", "per_depth_rank": [[0.9, 0.05, 0.01, 0.01]] * 8},
            "configs": [{"batch": 4, "kv_len": 4096, "t_dec": 0.01, "n": [4, 8, 16, 32],
                         "t_ver": [0.01] * 4, "b_ver": 16, "decision": decision}]}


def test_serve_applies_each_decided_mode():
    none = serving.derive_settings(_decided("none", budget=4), 4, 4096)
    assert none.mode == "none" and none.num_steps is None
    assert any("no speculation" in n for n in none.notes)
    argv, _ = serving.build_command("m", none, port=1)
    assert "--speculative-algorithm" not in argv and "--max-running-requests" in argv
    chain = serving.derive_settings(_decided("chain", 5, 1, 24), 4, 4096)
    assert (chain.num_steps, chain.eagle_topk, chain.num_draft_tokens) == (5, 1, 6)
    assert chain.plugin and chain.chain_verify == "bole"
    assert "chain d=5" in chain.why and "38% slower" in chain.why  # 500 vs 800 tok/s
    rssm = serving.derive_settings(_decided("chain", 5, 1, 24), 4, 4096, chain_verify="replayssm")
    argv, _ = serving.build_command("m", rssm, port=1)
    assert "--enable-linear-replayssm-spec" in argv and not rssm.plugin
    assert flag(argv, "--speculative-eagle-topk") == "1" and "--linear-replayssm-cache-len" not in argv
    deep = serving.derive_settings(_decided("chain", 5, 1, 24), 4, 4096, chain_verify="replayssm",
                                   steps=20, topk=1)
    argv, _ = serving.build_command("m", deep, port=1)  # 21 tokens: the window must hold them
    assert flag(argv, "--linear-replayssm-cache-len") == "32"
    tree = serving.derive_settings(_decided("tree", 6, 2, 32), 4, 4096)
    assert (tree.num_steps, tree.eagle_topk, tree.num_draft_tokens) == (6, 2, 8)
    assert "tree 6x2 N=32" in tree.why and "no speculation would be" in tree.why
    with pytest.raises(InputError, match="--chain-verify"):
        serving.derive_settings(_decided("chain", 5, 1, 24), 4, 4096, chain_verify="fold")


def test_a_profile_without_a_decision_asks_for_calibration():
    prof = _decided("tree", 6, 2, 32)
    del prof["configs"][0]["decision"]
    with pytest.raises(BoleError, match="re-run `bole calibrate`"):
        serving.derive_settings(prof, 4, 4096)
    s = serving.derive_settings(prof, 4, 4096, steps=3, topk=2, draft_tokens=8)  # by hand
    assert (s.mode, s.num_steps, s.eagle_topk, s.num_draft_tokens) == ("tree", 3, 2, 8)


def test_dry_run_panel_shows_settings_and_command(no_sglang):
    r = runner.invoke(cli.app, ["serve", "--model", "9b", "--gpu", "h200", "--dry-run"],
                      terminal_width=200)
    assert r.exit_code == 0, r.stderr
    text = r.stdout
    for part in ("bole serve (dry run)", "NEXTN", "h200", "Qwen3.5-9B.yaml", "draft tokens",
                 "SGLANG_PLUGINS=bole", "sglang.launch_server", "--speculative-eagle-topk",
                 "mode", "why", "predicted"):
        assert part in text, part


def test_eagle_with_a_draft_model_and_extra_args_override(no_sglang, tmp_path):
    eagle = tmp_path / "eagle"
    eagle.mkdir()
    # a local path that does not exist is refused before launch (a hub id goes as given)
    r = invoke("--model", "9b", "--gpu", "h200", "--draft-model", str(tmp_path / "nowhere"), "--dry-run")
    assert r.exit_code == 2 and "--draft-model: " in r.stderr and "no such folder" in r.stderr
    r = invoke("--model", "9b", "--gpu", "h200", "--draft-model", "org/eagle-head", "--dry-run", "--json")
    assert r.exit_code == 0 and flag(json.loads(r.stdout)["command"], "--speculative-draft-model-path") == "org/eagle-head"
    r = invoke("--model", "9b", "--gpu", "h200", "--draft-model", str(eagle), "--port", "31000",
               "--dry-run", "--json", "--", "--mem-fraction-static", "0.8",
               "--max-running-requests=32", "--speculative-num-steps", "5")
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    argv = res["command"]
    assert flag(argv, "--speculative-algorithm") == "EAGLE"
    assert flag(argv, "--speculative-draft-model-path") == str(eagle)
    assert flag(argv, "--port") == "31000"
    assert argv[-5:] == ["--mem-fraction-static", "0.8", "--max-running-requests=32",
                         "--speculative-num-steps", "5"]
    assert argv.count("--speculative-num-steps") == 1  # the extra one wins
    assert not any(a == "--max-running-requests" for a in argv)
    assert any("--max-running-requests" in n and "--speculative-num-steps" in n for n in res["notes"])


def test_tree_shape_from_the_acceptance_model():
    prof = {"acceptance": {"name": "x", "per_depth_rank": [[0.9, 0.05, 0.01]] * 6}}
    assert serving.tree_shape_from_profile(prof) == (6, 3, "acceptance model 'x'")
    assert serving.tree_shape_from_profile({})[:2] == (8, 4)


def test_overrides_and_clamps():
    tree = _decided("tree", 8, 4, 512)  # 128 tokens per request at batch 4: one deep tree
    s = serving.derive_settings(tree, 4, 4096)
    assert s.num_draft_tokens == 117 == serving.max_tree_tokens(8, 4)
    assert any("EAGLE tree of depth 8" in n for n in s.notes)
    s = serving.derive_settings(tree, 16, 4096, steps=3, topk=2, draft_tokens=64)
    assert (s.num_steps, s.eagle_topk, s.num_draft_tokens) == (3, 2, 1 + 2 + 2 * 4)
    s = serving.derive_settings(tree, 8, 4096, draft_tokens=3)
    assert (s.num_draft_tokens, s.num_steps) == (3, 2)  # depth <= tokens - 1
    s = serving.derive_settings(tree, 8, 4096, topk=1)  # --topk 1 is a chain now
    assert (s.mode, s.eagle_topk, s.num_draft_tokens) == ("chain", 1, 9)
    with pytest.raises(InputError, match="--batch"):
        serving.derive_settings(tree, 0, 4096)
    s = serving.derive_settings(tree, 1, 4096, steps=40, topk=8, draft_tokens=100000)
    assert s.num_draft_tokens == 256 and any("256" in n for n in s.notes)
    small = _decided("tree", 8, 4, 4)
    assert serving.derive_settings(small, 16, 4096).num_draft_tokens == 2


def test_profile_file_for_an_uncatalogued_model(no_sglang, tmp_path):
    prof = load_profile(find_profile("a100", MODELS["27b"]))
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(prof))
    r = invoke("--model", "my-org/Qwen3.5-27B-ft", "--profile", str(path), "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["gpu"] == "a100" and res["profile"] == str(path) and res["memory"] is None
    assert flag(res["command"], "--model-path") == "my-org/Qwen3.5-27B-ft"


def test_panel_of_a_no_speculation_decision(no_sglang, tmp_path):
    """A profile that decides no speculation: the panel (not only --json) shows the mode and
    no algorithm or draft rows (there is no drafter to name)."""
    prof = load_profile(find_profile("h200", MODELS["9b"]))
    for entry in prof["configs"]:  # as calibrate writes it: decode verifies the batch
        entry["decision"] = _decided("none", budget=entry["batch"])["configs"][0]["decision"]
        entry["decision"]["chosen"]["verify"] = "decode"
    path = tmp_path / "none.yaml"
    path.write_text(yaml.safe_dump(prof))
    r = runner.invoke(cli.app, ["serve", "--model", "9b", "--profile", str(path), "--dry-run"],
                      terminal_width=200)
    assert r.exit_code == 0, r.stderr
    assert "no speculation" in r.stdout and "algorithm" not in r.stdout and "draft tokens" not in r.stdout


# ----------------------------------------------------------------- errors


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_missing_profile_names_the_calibrate_command(no_sglang, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    r = invoke("--model", "2b", "--gpu", "h200", "--dry-run")
    assert r.exit_code == 1
    line = _one_line(r.stderr)
    assert "no profile for Qwen/Qwen3.5-2B on h200" in line
    assert "bole calibrate --gpu h200 --model Qwen3.5-2B" in line and "--profile" in line


def test_no_gpu_needs_gpu_option(no_sglang, monkeypatch):
    import bole_cli.catalog.hardware as hw

    monkeypatch.setattr(hw, "detect_gpu", lambda index=None: None)
    r = invoke("--model", "9b", "--dry-run")
    assert r.exit_code == 2
    assert "no CUDA GPU detected" in _one_line(r.stderr) and "--gpu" in r.stderr


def test_a_detected_card_of_another_part_is_served_with_a_note(no_sglang, monkeypatch):
    """An H100 PCIe is detected as the h100 family: served from the SXM card's profile, and
    the notes say its figures are another part's (`--gpu "NVIDIA H100 PCIe"` is refused)."""
    import bole_cli.catalog.hardware as hw

    spec = hw.resolve_gpu("h100")
    card = hw.DetectedGpu("NVIDIA H100 PCIe", 80 * 2**30, 114, (9, 0), spec=spec,
                          mismatch=hw._mismatch("NVIDIA H100 PCIe", 80 * 2**30, spec))
    monkeypatch.setattr(hw, "detect_gpu", lambda index=None: card)
    r = invoke("--model", "9b", "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    notes = json.loads(r.stdout)["notes"]
    assert "NVIDIA H100 PCIe is a PCIe card; catalogue figures are for the H100 SXM" in notes


def test_unknown_model_without_profile_is_input_error(no_sglang):
    r = invoke("--model", "someone/other-model", "--gpu", "h200", "--dry-run")
    assert r.exit_code == 2 and "--profile" in _one_line(r.stderr)


def test_without_sglang_one_line_names_the_extra(no_sglang):
    r = invoke("--model", "9b", "--gpu", "h200")
    assert r.exit_code == 1 and r.stdout == ""
    line = _one_line(r.stderr)
    assert line == 'error: SGLang is not installed: pip install "sglang==0.5.23"'  # on an index


def test_wrong_sglang_version_or_missing_entry_point(fake_sglang):
    status, launched = fake_sglang
    status["version"] = "0.5.22"
    r = invoke("--model", "9b", "--gpu", "h200")
    assert r.exit_code == 1 and "needs SGLang 0.5.23" in _one_line(r.stderr) and not launched
    status.update(version="0.5.23", plugin_registered=False)
    r = invoke("--model", "9b", "--gpu", "h200")
    assert r.exit_code == 1 and "entry point 'bole'" in _one_line(r.stderr) and not launched


def test_sglang_status_reports_the_real_environment():
    st = serving.sglang_status()
    assert set(st) == {"installed", "version", "pinned", "plugin_registered"}
    assert st["pinned"] == "0.5.23"


# ----------------------------------------------------------------- launch


def test_launch_replaces_the_process_with_the_plugin_enabled(fake_sglang, monkeypatch):
    _, launched = fake_sglang
    monkeypatch.setenv("SGLANG_PLUGINS", "other")
    r = invoke("--model", "27b", "--gpu", "a100", "--batch", "2", "--", "--tp", "2")
    assert r.exit_code == 0, r.stderr
    (argv, env), = launched
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"] and argv[-2:] == ["--tp", "2"]
    assert flag(argv, "--model-path") == "Qwen/Qwen3.5-27B"
    assert env["SGLANG_PLUGINS"] == "other,bole"
    assert "sglang.launch_server" in r.stdout and "starting SGLang" in r.stderr


def test_launch_under_json_leaves_stdout_to_the_json(fake_sglang, monkeypatch):
    """`bole serve --json` without --dry-run: the JSON on stdout, then SGLang's own output on
    stderr (a real exec in a child process), so stdout parses as the JSON alone."""
    import subprocess

    kept = []
    monkeypatch.setattr(serve_cmd, "_launch", lambda argv, env, stdout_to_stderr=False: kept.append(stdout_to_stderr))
    r = invoke("--model", "9b", "--gpu", "h200", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["command"][:3] == [sys.executable, "-m", "sglang.launch_server"] and kept == [True]
    child = ("import sys; from bole_cli.commands import serve; print('{}', flush=True); "
             "serve._launch([sys.executable, '-c', 'print(\\'server log\\')'], {}, stdout_to_stderr=True)")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "{}\n" and done.stderr == "server log\n", done


def test_plugin_env_keeps_other_plugins():
    assert serving.plugin_env({})["SGLANG_PLUGINS"] == "bole"
    assert serving.plugin_env({"SGLANG_PLUGINS": "a, bole"})["SGLANG_PLUGINS"] == "a,bole"
    assert serving.plugin_env({"SGLANG_PLUGINS": "a"})["SGLANG_PLUGINS"] == "a,bole"


def test_bad_port_is_input_error(no_sglang):
    r = invoke("--model", "9b", "--gpu", "h200", "--port", "70000", "--dry-run")
    assert r.exit_code == 2 and "--port" in _one_line(r.stderr)
