"""Profiles: schema validation, round trip, section merges, lookup, and the shipped files."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import re

import pytest
import yaml

from bole_cli.calibrate.acceptance import preset
from bole_cli.calibrate.costmodel import RooflineForward
from bole_cli.calibrate.sweep import EXACT, build_profile, run_sweep, write_profile
from bole_cli.catalog.hardware import resolve_gpu
from bole_cli.catalog.models import resolve_model
from bole_cli.errors import BoleError, InputError
from bole_cli.profiles import (dump_profile, find_profile, load_profile, lookup_budget,
                               merge_section, profile_path, save_profile,
                               shipped_profiles_dir, validate_profile)

BATCHES, KVS, GRID = [1, 2, 4, 8, 16], [1024, 4096, 16384], [8, 16, 32, 64, 128, 256]


def _profile(kind: str = "estimated", gpu: str = "a100", model: str = "9b") -> dict:
    spec = resolve_model(model)
    sweep = run_sweep(RooflineForward(spec, resolve_gpu(gpu)), BATCHES, KVS, GRID, EXACT)
    profile, _ = build_profile(gpu_key=gpu, model_name=spec.name, kind=kind, sweep=sweep,
                               grid=GRID, eps=0.05, acceptance=preset("paper-mbpp"),
                               device_name="test")
    return profile


@pytest.fixture(scope="module")
def profile() -> dict:
    return _profile()


# ---- round trip ---------------------------------------------------------------------------------
def test_round_trip(tmp_path, profile):
    path = save_profile(tmp_path / "p.yaml", profile)
    back = load_profile(path)
    assert back["configs"][3]["t_ver"] == pytest.approx(profile["configs"][3]["t_ver"], rel=1e-4)
    assert back["provenance"] == profile["provenance"]
    assert [(c["batch"], c["kv_len"], c["b_ver"], c["n_star"]) for c in back["configs"]] == \
           [(c["batch"], c["kv_len"], c["b_ver"], c["n_star"]) for c in profile["configs"]]
    # stable: dumping what was loaded gives the same text
    assert dump_profile(back) == path.read_text()
    assert list(back)[:5] == ["bole_profile", "gpu", "model", "dtype", "provenance"]


def test_unknown_sections_survive(tmp_path, profile):
    data = dict(profile, extra_tool={"x": 1})
    back = load_profile(save_profile(tmp_path / "p.yaml", data))
    assert back["extra_tool"] == {"x": 1}


# ---- schema errors ------------------------------------------------------------------------------
def _broken(profile, edit):
    data = copy.deepcopy(profile)
    edit(data)
    return data


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["configs"][3].__setitem__("t_ver", "fast"),
     "profile.yaml: configs[3].t_ver: expected a list of numbers"),
    (lambda d: d["configs"][3].__setitem__("t_ver", [1.0, "x"]),
     "profile.yaml: configs[3].t_ver: expected a list of numbers"),
    (lambda d: d["configs"][0].pop("t_dec"), "profile.yaml: configs[0].t_dec: missing required field"),
    (lambda d: d["configs"][2].__setitem__("batch", "8"), "configs[2].batch: expected an integer"),
    (lambda d: d["configs"][1].__setitem__("t_ver", d["configs"][1]["t_ver"][:-1]),
     "configs[1].t_ver: expected"),
    (lambda d: d["configs"][1].__setitem__("b_ver", 7), "configs[1].b_ver: 7 is not one of"),
    (lambda d: d["configs"][1].__setitem__("n_star", 9), "configs[1].n_star"),
    (lambda d: d["configs"].append(dict(d["configs"][0])), "duplicate configuration"),
    (lambda d: d.pop("provenance"), "profile.yaml: provenance: missing required field"),
    (lambda d: d["provenance"].__setitem__("kind", "guessed"), "provenance.kind: expected one of"),
    (lambda d: d["provenance"].__setitem__("partial", "no"), "provenance.partial: expected true"),
    (lambda d: d.pop("grid"), "grid: missing required field"),
    (lambda d: d.__setitem__("grid", [8, 8]), "grid: expected strictly increasing"),
    (lambda d: d.__setitem__("eps", 0), "eps: expected a number > 0"),
    (lambda d: d.__setitem__("gpu", 100), "gpu: expected a string"),
    (lambda d: d.__setitem__("kernels", []), "kernels: expected a mapping"),
    (lambda d: d.__setitem__("configs", {}), "configs: expected a list"),
    (lambda d: d.__setitem__("bole_profile", 99), "newer than this bole reads"),
])
def test_schema_errors_name_the_field(profile, edit, message):
    with pytest.raises(InputError) as exc:
        validate_profile(_broken(profile, edit), "profile.yaml")
    assert message in str(exc.value)


def test_foreign_and_broken_files(tmp_path):
    foreign = tmp_path / "other.yaml"
    foreign.write_text("name: something\nvalues: [1, 2]\n")
    with pytest.raises(InputError, match="not a Bole profile"):
        load_profile(foreign)
    for text in ("- a\n- b\n", "", "42\n"):
        foreign.write_text(text)
        with pytest.raises(InputError, match="not a Bole profile"):
            load_profile(foreign)
    broken = tmp_path / "broken.yaml"
    broken.write_text("bole_profile: 1\nconfigs: [\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_profile(broken)
    with pytest.raises(InputError, match="no such profile"):
        load_profile(tmp_path / "missing.yaml")


def test_save_refuses_an_invalid_profile(tmp_path, profile):
    bad = _broken(profile, lambda d: d["configs"][0].pop("n"))
    with pytest.raises(InputError, match=r"configs\[0\]\.n: missing"):
        save_profile(tmp_path / "p.yaml", bad)
    assert not (tmp_path / "p.yaml").exists()


# ---- merge_section -----------------------------------------------------------------------------
def test_merge_section_keeps_the_other_sections(tmp_path, profile):
    path = tmp_path / "p.yaml"
    write_profile(path, profile)
    merge_section(path, "kernels", {"verify/T64/HV32": {"BLOCK_T": 64, "num_warps": 4}})
    merged = load_profile(path)
    assert merged["kernels"]["verify/T64/HV32"]["BLOCK_T"] == 64
    assert len(merged["configs"]) == len(profile["configs"])
    with pytest.raises(InputError, match="kernels: expected a mapping"):
        merge_section(path, "kernels", [1, 2])
    assert load_profile(path)["kernels"]["verify/T64/HV32"]["num_warps"] == 4  # untouched


def test_merge_section_new_file_needs_a_skeleton(tmp_path):
    path = tmp_path / "h200" / "m.yaml"
    with pytest.raises(InputError, match="no such profile"):
        merge_section(path, "kernels", {})
    skeleton = {"gpu": "h200", "model": "m", "provenance": {
        "kind": "measured", "bole_version": "0", "date": "now", "device_name": "H200"}}
    merge_section(path, "kernels", {"a": 1}, create=skeleton)
    data = load_profile(path)
    assert data["kernels"] == {"a": 1} and "configs" not in data
    with pytest.raises(BoleError, match="no budget configurations"):
        lookup_budget(data, 1, 1024)


def test_concurrent_merges_lose_nothing(tmp_path, profile):
    path = tmp_path / "p.yaml"
    write_profile(path, profile)

    def worker(key):
        for i in range(8):
            merge_section(path, key, {"round": i})

    threads = [threading.Thread(target=worker, args=(f"section_{k}",)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = load_profile(path)
    assert all(data[f"section_{k}"] == {"round": 7} for k in range(4))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ---- lookup -------------------------------------------------------------------------------------
def test_lookup_exact(profile):
    entry, note = lookup_budget(dict(profile, provenance=dict(profile["provenance"], kind="measured")),
                                8, 4096)
    assert (entry["batch"], entry["kv_len"]) == (8, 4096) and note == "exact match"


@pytest.mark.parametrize("batch, kv, want, words", [
    (3, 2500, (4, 4096), ["batch 3 -> 4", "kv_len 2500 -> 4096"]),
    (6, 1500, (8, 1024), ["batch 6 -> 8", "kv_len 1500 -> 1024"]),
    (64, 100000, (16, 16384), ["batch 64 -> 16 (outside", "kv_len 100000 -> 16384 (outside"]),
    (1, 10, (1, 1024), ["kv_len 10 -> 1024 (outside"]),
])
def test_lookup_nearest_states_the_fallback(profile, batch, kv, want, words):
    entry, note = lookup_budget(profile, batch, kv)
    assert (entry["batch"], entry["kv_len"]) == want
    for w in words + ["estimated profile"]:
        assert w in note


def test_lookup_notes_partial_and_below_threshold(profile):
    data = copy.deepcopy(profile)
    data["provenance"]["partial"] = True
    data["configs"] = [c for c in data["configs"] if c["batch"] == 2]
    data["configs"][0]["below_threshold"] = True
    entry, note = lookup_budget(data, 16, 1024)
    assert entry["batch"] == 2
    assert "batch 16 -> 2" in note and "partial profile" in note and "no grid point" in note


def test_lookup_says_when_the_cell_asked_for_failed_in_the_sweep(profile):
    """A batch (or a batch's KV length) the sweep tried and could not fit falls back like
    one never swept, and the note says it failed rather than leave it to be guessed."""
    data = copy.deepcopy(profile)
    data["provenance"]["failures"] = ["batch 64, kv 1024, decode: BoleError: does not fit",
                                      "batch 8, kv 65536, decode: BoleError: does not fit"]
    assert "batch 64 failed when calibrated" in lookup_budget(data, 64, 4096)[1]
    note = lookup_budget(data, 8, 65536)[1]
    assert "batch 8, kv_len 65536 failed when calibrated" in note and "kv_len 65536 -> 16384" in note
    for batch, kv in ((32, 1024), (8, 32768), (8, 4096)):  # not swept, or found
        assert "failed" not in lookup_budget(data, batch, kv)[1]


def test_find_profile_prefers_measured_then_search_order(tmp_path):
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    assert find_profile("a100", "Qwen/Qwen3.5-9B", [user, shipped]) is None
    est = _profile("estimated")
    write_profile(profile_path(user, "a100", "Qwen/Qwen3.5-9B"), est)
    write_profile(profile_path(shipped, "a100", "Qwen/Qwen3.5-9B"), est)
    assert find_profile("a100", resolve_model("9b"), [user, shipped]) == \
        profile_path(user, "a100", "Qwen3.5-9B")
    write_profile(profile_path(shipped, "a100", "Qwen3.5-9B"), dict(
        est, provenance=dict(est["provenance"], kind="measured")))
    assert find_profile(resolve_gpu("a100"), "Qwen/Qwen3.5-9B", [user, shipped]) == \
        profile_path(shipped, "a100", "Qwen3.5-9B")
    # an unreadable candidate is skipped
    profile_path(tmp_path / "bad", "a100", "Qwen3.5-9B").parent.mkdir(parents=True)
    profile_path(tmp_path / "bad", "a100", "Qwen3.5-9B").write_text("nonsense: 1\n")
    assert find_profile("a100", "Qwen3.5-9B", [tmp_path / "bad"]) is None


def test_profile_path_layout():
    assert profile_path("/p", "A100", "Qwen/Qwen3.5-27B") == Path("/p/a100/Qwen3.5-27B.yaml")
    assert profile_path("/p", "h200", "my model/v2") == Path("/p/h200/v2.yaml")


# ---- shipped profiles ---------------------------------------------------------------------------
SHIPPED = [(g, m) for g in ("a100", "gb10", "h100", "h200") for m in ("Qwen3.5-4B", "Qwen3.5-9B", "Qwen3.5-27B")]


@pytest.mark.parametrize("gpu, model", SHIPPED)
def test_shipped_profiles_are_valid_and_labelled(gpu, model):
    path = profile_path(shipped_profiles_dir(), gpu, model)
    data = load_profile(path)
    assert data["gpu"] == gpu and data["model"] == f"Qwen/{model}"
    prov = data["provenance"]
    assert not prov["partial"]
    if prov["kind"] == "estimated":
        assert "ESTIMATED" in prov["note"]
        if gpu == "h200":
            assert "placeholder" in prov["note"]
    else:
        assert gpu in ("h100", "h200")  # only the Hopper profiles are measured
    grid = {(c["batch"], c["kv_len"]) for c in data["configs"]}
    if prov["kind"] == "estimated":
        assert grid == {(b, kv) for b in BATCHES for kv in KVS}
    else:  # measured sweeps are cut to what one device call allows; still a real grid
        assert {b for b, _ in grid} >= {1, 4, 16} and (8, 4096) in grid or (16, 4096) in grid
        assert all("decision" in c for c in data["configs"])  # drafting counted everywhere
    entry, _ = lookup_budget(data, 8, 4096)
    assert entry["n_star"] is not None


def test_shipped_9b_budgets_follow_the_paper():
    a100 = lookup_budget(load_profile(profile_path(shipped_profiles_dir(), "a100", "Qwen3.5-9B")), 8, 4096)[0]
    gb10 = lookup_budget(load_profile(profile_path(shipped_profiles_dir(), "gb10", "Qwen3.5-9B")), 8, 4096)[0]
    assert 64 <= a100["n_star"] <= 256 and 128 <= gb10["n_star"] <= 512
    assert gb10["n_star"] > a100["n_star"]


def test_every_shipped_profile_folder_travels_in_the_wheel():
    """A folder of profiles/ missing from pyproject's data-files ships in a checkout only: a
    pip install would fall back to the estimate for that GPU."""
    import tomllib

    root = Path(__file__).resolve().parents[1] / "profiles"  # the checkout's, whatever is installed
    data_files = tomllib.loads((root.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    folders = sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.yaml")))
    assert folders and all(data_files.get(f"share/bole/profiles/{g}") == [f"profiles/{g}/*.yaml"]
                           for g in folders), (folders, data_files)


def test_no_stray_files_in_shipped_profiles():
    files = sorted(p.relative_to(shipped_profiles_dir()).as_posix()
                   for p in shipped_profiles_dir().rglob("*") if p.is_file())
    assert all(f.endswith((".yaml", ".png", ".md")) for f in files), files
    for f in files:
        if f.endswith(".yaml"):
            assert yaml.safe_load((shipped_profiles_dir() / f).read_text())["bole_profile"] in (1, 2)


@pytest.mark.parametrize("where,edit,culprit", [
    ("chosen", lambda ch: ch.pop("label"), "decision.chosen.label"),
    ("chosen", lambda ch: ch.update(verify="garbage"), "decision.chosen.verify"),
    ("chosen", lambda ch: ch.update(mode="tree", topk=1), "decision.chosen"),
    ("chosen", lambda ch: ch.update(mode="tree", depth=40, topk=4), "decision.chosen"),
    ("chosen", lambda ch: ch.update(mode="chain", topk=1, depth=3, budget=5), "decision.chosen"),
    ("runner_up", lambda ch: ch.update(mode="__chosen__"), "decision.runner_up"),
])
def test_a_corrupt_decision_names_its_field(where, edit, culprit):
    """serve acts on the decision: a wrong shape, verifier or runner-up must not pass."""
    import copy

    data = copy.deepcopy(yaml.safe_load(
        (shipped_profiles_dir() / "a100" / "Qwen3.5-9B.yaml").read_text()))
    dec = data["configs"][0]["decision"]
    target = dec[where]
    assert target is not None  # the shipped bucket has a runner-up: the test must bite
    edit(target)
    if target.get("mode") == "__chosen__":
        target.update({k: dec["chosen"][k] for k in dec["chosen"]})
    with pytest.raises(InputError, match=re.escape(culprit)):
        validate_profile(data, "p.yaml")
