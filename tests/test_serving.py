"""bole_cli.serving, the library behind `bole serve`: the command line from its settings,
the SGLang arguments it reads, the memory summary and the whole plan."""

from __future__ import annotations

from dataclasses import replace

from pathlib import Path

import pytest

from bole_cli import serving
from bole_cli.catalog.models import resolve_model
from bole_cli.errors import BoleError, InputError

SETTINGS = serving.ServeSettings(
    mode="tree", why="test", batch=8, kv_len=4096, max_running_requests=8, profile_batch=8,
    profile_kv_len=4096, b_ver=16, n_star=None, predicted=None, runner_up=None,
    algorithm="NEXTN", draft_model=None, num_steps=3, eagle_topk=4, num_draft_tokens=16,
    chain_verify=None, plugin=True, notes=(), tree_source="test")


def test_build_command_of_the_settings():
    argv, overridden = serving.build_command("Qwen/Qwen3.5-9B", SETTINGS, port=30000,
                                             python="/py")
    assert argv == ["/py", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3.5-9B",
                    "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                    "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16",
                    "--max-running-requests", "8", "--port", "30000"]
    assert overridden == []


def test_build_command_with_a_draft_model_host_and_overrides():
    settings = replace(SETTINGS, algorithm="EAGLE", draft_model="/ckpt/eagle")
    argv, overridden = serving.build_command("m", settings, port=1, host="0.0.0.0",
                                             extra=["--port=2", "--tp", "2"], python="/py")
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "/ckpt/eagle"
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert "--port" not in argv and argv[-3:] == ["--port=2", "--tp", "2"]
    assert overridden == ["--port"]


def test_settings_json_keeps_its_keys_and_order():
    d = replace(SETTINGS, notes=("a", "b")).to_dict()
    assert list(d) == ["mode", "why", "batch", "kv_len", "max_running_requests", "profile_batch",
                       "profile_kv_len", "b_ver", "n_star", "predicted", "runner_up", "algorithm",
                       "draft_model", "num_steps", "eagle_topk", "num_draft_tokens",
                       "chain_verify", "plugin", "notes", "tree_source"]
    assert d["notes"] == ["a", "b"] and d["num_steps"] == 3


def test_state_dtype_from_the_extra_arguments():
    assert serving.state_dtype_from_args(None) == "float32"
    assert serving.state_dtype_from_args(["--mamba-ssm-dtype", "bfloat16"]) == "bfloat16"
    assert serving.state_dtype_from_args(["--mamba-ssm-dtype=float16", "--tp", "2"]) == "float16"
    assert serving.state_dtype_from_args(["--tp", "2"]) == "float32"
    # SGLang's parser refuses these at launch: refused here first, naming the flag
    for extra in (["--mamba-ssm-dtype"], ["--mamba-ssm-dtype="], ["--mamba-ssm-dtype", "--tp", "2"],
                  ["--mamba-ssm-dtype", "bfloat16", "--mamba-ssm-dtype"]):
        with pytest.raises(InputError, match="--mamba-ssm-dtype after `--` needs a value"):
            serving.state_dtype_from_args(extra)
    with pytest.raises(InputError, match="'fp8' is not one SGLang takes"):
        serving.state_dtype_from_args(["--mamba-ssm-dtype", "fp8"])


def test_max_tree_tokens_is_sglangs_eagle_tree():
    assert serving.max_tree_tokens(1, 4) == 5 and serving.max_tree_tokens(8, 4) == 117


def test_memory_summary_counts_the_arena_against_snapshots():
    spec = resolve_model("9b")
    mem = serving.memory_summary(spec, SETTINGS)
    assert mem["freed_bytes"] == mem["sglang_snapshot_bytes"] - mem["bole_arena_bytes"] > 0
    assert mem["bole_scratch_bytes"] == 0  # trees of at most 64 nodes: one tile, no scratch
    big = serving.memory_summary(spec, replace(SETTINGS, num_draft_tokens=128))
    assert big["bole_scratch_bytes"] > 0  # past one tile: the blocked kernel's SPLIT scratch
    assert big["freed_bytes"] == (big["sglang_snapshot_bytes"] - big["bole_arena_bytes"]
                                  - big["bole_scratch_bytes"])
    bf16 = serving.memory_summary(spec, SETTINGS, "bfloat16")
    assert bf16["sglang_snapshot_bytes"] < mem["sglang_snapshot_bytes"]
    assert bf16["bole_arena_bytes"] == mem["bole_arena_bytes"]  # factors do not follow the state
    assert serving.memory_summary(None, SETTINGS) is None
    assert serving.memory_summary(spec, replace(SETTINGS, plugin=False)) is None  # SGLang's own
    with pytest.raises(KeyError):
        serving.memory_summary(spec, SETTINGS, "fp8")


def test_check_can_launch():
    ok = {"installed": True, "version": "0.5.23", "plugin_registered": True}
    serving.check_can_launch(ok)
    for bad, needle in ((dict(ok, installed=False), "not installed"),
                        (dict(ok, version="0.5.22"), "needs SGLang 0.5.23"),
                        (dict(ok, plugin_registered=False), "entry point 'bole'")):
        with pytest.raises(BoleError, match=needle):
            serving.check_can_launch(bad)


def test_plan_serve_dry_run(monkeypatch):
    monkeypatch.setattr(serving, "sglang_status", lambda: {
        "installed": False, "version": None, "pinned": "0.5.23", "plugin_registered": False})
    plan = serving.plan_serve("9b", gpu="h200", batch=4, dry_run=True,
                              extra=["--mamba-ssm-dtype", "bfloat16"])
    assert plan.argv == plan.report["command"] and plan.env["SGLANG_PLUGINS"].endswith("bole")
    assert plan.report["memory"]["state_dtype"] == "bfloat16"
    assert plan.report["settings"]["max_running_requests"] == 4
    assert plan.report["settings"] == plan.settings.to_dict()
    with pytest.raises(BoleError, match="not installed"):
        serving.plan_serve("9b", gpu="h200")  # not a dry run: SGLang is checked, after the options
    # a bad option is named as such without SGLang too, not blamed on the missing install
    for kwargs, needle in ((dict(batch=0), "--batch"), (dict(gpu="nosuch"), "nosuch"),
                           (dict(kv_len=-1), "--kv-len")):
        with pytest.raises(InputError, match=needle):
            serving.plan_serve("9b", **{"gpu": "h200", **kwargs})
    with pytest.raises(InputError, match="--port"):
        serving.plan_serve("9b", gpu="h200", port=0, dry_run=True)


def test_plan_serve_refuses_another_models_profile(tmp_path, monkeypatch):
    """A --profile measured for another catalogue model is an input error naming the file:
    its decisions (tree or chain, budgets) are another model's (a bad-input sweep found it
    served as a note). A model the catalogue cannot name (a config folder, a fine-tune) is
    served with a note: only two known models are known to differ."""
    import json
    import shutil

    from bole_cli.profiles import profile_path, shipped_profiles_dir

    monkeypatch.setattr(serving, "sglang_status", lambda: {
        "installed": False, "version": None, "pinned": "0.5.23", "plugin_registered": False})
    nine = profile_path(shipped_profiles_dir(), "h100", "Qwen/Qwen3.5-9B")
    with pytest.raises(InputError, match=r"--profile: .*Qwen3.5-9B.*not of Qwen/Qwen3.5-27B"):
        serving.plan_serve("27b", profile=nine, dry_run=True)
    assert serving.plan_serve("9b", profile=nine, dry_run=True).report["profile"] == str(nine)
    # the 9B's own checkpoint folder (a config.json with no _name_or_path), its profile found
    # by its name or given: served, the names' difference a note
    folder = tmp_path / "Qwen3.5-9B"
    folder.mkdir()
    config = json.loads((Path(__file__).parent / "data" / "configs" / "qwen3_5_9b.json").read_text())
    config.pop("_name_or_path", None)
    (folder / "config.json").write_text(json.dumps(config))
    for given in (None, nine):
        plan = serving.plan_serve(str(folder), gpu="h100", profile=given, dry_run=True)
        assert plan.report["profile"].endswith("Qwen3.5-9B.yaml")
    # a profile calibrated from that folder (its model the config's name) serves the 9B
    theirs = tmp_path / "theirs.yaml"
    shutil.copy(nine, theirs)
    theirs.write_text(theirs.read_text().replace("model: Qwen/Qwen3.5-9B", "model: Qwen3.5-9B"))
    assert "model: Qwen3.5-9B\n" in theirs.read_text()
    serving.plan_serve("Qwen3.5-9B", profile=theirs, dry_run=True)


def test_a_profile_without_a_decision_is_named(tmp_path):
    """An old or hand-made profile without decisions: an input error naming the file."""
    import yaml

    from bole_cli.profiles import profile_path, shipped_profiles_dir

    prof = yaml.safe_load(profile_path(shipped_profiles_dir(), "h100", "Qwen/Qwen3.5-9B").read_text())
    for entry in prof["configs"]:
        entry.pop("decision")
    with pytest.raises(InputError, match=r"my\.yaml has no decision for batch"):
        serving.derive_settings(prof, 4, 4096, source="my.yaml")


def test_serve_names_an_empty_host_and_a_depth_past_the_tree(monkeypatch):
    """--host '' was dropped without a word; --steps deeper than --draft-tokens can verify
    was passed on without one (a bad-input sweep)."""
    monkeypatch.setattr(serving, "sglang_status", lambda: {
        "installed": False, "version": None, "pinned": "0.5.23", "plugin_registered": False})
    with pytest.raises(InputError, match="--host: an empty address"):
        serving.plan_serve("9b", gpu="h200", host=" ", dry_run=True)
    plan = serving.plan_serve("9b", gpu="h200", steps=100, topk=2, draft_tokens=16, dry_run=True)
    assert plan.settings.num_steps == 100
    assert any("--steps 100: a tree of 16 tokens verifies at most 15 levels" in n
               for n in plan.settings.notes)
    plan = serving.plan_serve("9b", gpu="h200", steps=4, topk=2, draft_tokens=16, dry_run=True)
    assert not any(n.startswith("--steps") for n in plan.settings.notes)
