"""--draft-vocab across the commands that price or run the drafter: `bole calibrate` prices
a hot-token head (SGLang's --speculative-token-map) and its profile says so, `bole bench
e2e` predicts nothing from a profile of another head, and `bole serve` says what the
decision assumes (docs/design.md §8)."""

from __future__ import annotations

import json
import types

import pytest
from typer.testing import CliRunner

from bole_cli import cli
from bole_cli.calibrate.costmodel import RooflineForward
from bole_cli.catalog.hardware import resolve_gpu
from bole_cli.catalog.models import resolve_model
from bole_cli.errors import InputError
from bole_cli.profiles import load_profile

runner = CliRunner()
HOT = 32768


def _calibrate(out, *extra: str):
    return runner.invoke(cli.app, ["calibrate", "--gpu", "h200", "--model", "9b", "--estimate",
                                   "--batch", "1,4", "--kv", "4096", "--no-plot", "--out", str(out),
                                   *extra])


def test_the_estimate_prices_the_hot_token_head_and_the_profile_says_so(tmp_path):
    out = tmp_path / "p.yaml"
    r = _calibrate(out, "--draft-vocab", str(HOT))
    assert r.exit_code == 0, r.output
    assert "drafting over 32,768 hot tokens" in r.stdout
    hot = load_profile(out)
    assert hot["draft_vocab"] == HOT
    assert "--draft-vocab 32768" in hot["provenance"]["command"]
    spec, gpu = resolve_model("9b"), resolve_gpu("h200")
    for c in hot["configs"]:  # each level as the roofline prices a 32k head, every width
        for rows, level in enumerate(c["draft_level"], start=1):
            want = RooflineForward(spec, gpu, draft_vocab=HOT).time_draft_level(c["batch"], c["kv_len"], rows)
            assert level == pytest.approx(want, rel=1e-3)

    r = _calibrate(out)  # the full vocabulary over the same file: the old head's field goes
    assert r.exit_code == 0, r.output
    full = load_profile(out)
    assert full["draft_vocab"] is None and "--draft-vocab" not in full["provenance"]["command"]
    for h, f in zip(hot["configs"], full["configs"]):  # 215k fewer LM-head rows a level
        assert all(a < 0.8 * b for a, b in zip(h["draft_level"], f["draft_level"]))


def test_a_hot_token_profile_goes_beside_the_full_one_never_over_it(tmp_path, monkeypatch):
    """Without --out, calibrate writes to the cache: the hot head's profile under its own
    name, so the full vocabulary's (what serve and bench e2e read by default) stays."""
    from bole_cli.profiles import find_profile

    monkeypatch.setenv("BOLE_CACHE_DIR", str(tmp_path))
    base = ["calibrate", "--gpu", "a100", "--model", "9b", "--estimate", "--batch", "1", "--kv", "4096",
            "--no-plot"]
    assert runner.invoke(cli.app, base).exit_code == 0
    r = runner.invoke(cli.app, base + ["--draft-vocab", str(HOT)])
    assert r.exit_code == 0, r.output
    full, hot = find_profile("a100", "Qwen/Qwen3.5-9B"), find_profile("a100", "Qwen/Qwen3.5-9B", draft_vocab=HOT)
    assert full.name == "Qwen3.5-9B.yaml" and hot.name == "Qwen3.5-9B-vocab32768.yaml"
    assert load_profile(full)["draft_vocab"] is None and load_profile(hot)["draft_vocab"] == HOT
    text = hot.read_text()
    assert text.index("draft_vocab:") < text.index("provenance:")  # the schema's order
    doc = json.loads(runner.invoke(cli.app, base + ["--draft-vocab", str(HOT), "--json"]).stdout)
    assert "given a map of 32,768 hot tokens" in doc["served"]  # serve takes it with SGLang's map
    assert doc["serve_command"].endswith("-- --speculative-token-map FILE")
    doc = json.loads(runner.invoke(cli.app, base + ["--draft-vocab", str(HOT), "--json", "--out",
                                                    str(tmp_path / "elsewhere.yaml")]).stdout)
    assert "an estimated profile" in doc["served"] and "vocab32768.yaml; `bole serve` uses that one" in doc["served"]
    assert "--profile" in doc["serve_command"] and doc["serve_command"].endswith("--speculative-token-map FILE")
    b200 = [a.replace("a100", "b200") for a in base]  # no profile of that GPU anywhere
    doc = json.loads(runner.invoke(cli.app, b200 + ["--draft-vocab", str(HOT), "--json", "--out",
                                                    str(tmp_path / "b200.yaml")]).stdout)
    assert "no profile of this head" in doc["served"] and "--profile" in doc["serve_command"]


def test_the_whole_vocabulary_named_is_the_full_head(tmp_path):
    out = tmp_path / "p.yaml"
    r = _calibrate(out, "--draft-vocab", str(resolve_model("9b").vocab))
    assert r.exit_code == 0, r.output
    prof = load_profile(out)
    assert prof["draft_vocab"] is None and "--draft-vocab" not in prof["provenance"]["command"]
    assert "hot tokens" not in r.stdout


@pytest.mark.parametrize("value", ["0", "3", "248321", "-5"])  # 3: under the preset's top-4
def test_a_draft_vocabulary_outside_the_model_is_refused_in_one_line(tmp_path, value):
    out = tmp_path / "p.yaml"
    r = _calibrate(out, f"--draft-vocab={value}")
    assert r.exit_code == 2 and not out.exists()
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--draft-vocab" in lines[0] and "Traceback" not in r.output


def test_a_measured_level_drafts_over_the_hot_tokens_on_cpu():
    import torch

    from bole_cli.calibrate.measured import MeasuredForward
    from bole_cli.runtime.model import tiny_spec
    from bole_cli.runtime.timer import HybridForwardTimer

    fwd = MeasuredForward(HybridForwardTimer(tiny_spec(), "cpu", torch.float32, serving_step=True),
                          draft_vocab=7, inner=1)
    assert fwd.time_draft_level(1, 16, 2) > 0
    drafter = fwd._drafter(2)
    assert drafter.draft_vocab == 7 and drafter.lm_head.shape[0] == 7
    assert "scoring 7 hot tokens" in fwd.info()["drafter"]


def _pricer(monkeypatch, tmp_path, draft_vocab):
    """bench e2e's pricer for 9B on an H200 (the shipped profile: the full vocabulary)."""
    from bole_cli.bench.e2e.prediction import profile_pricer
    monkeypatch.setenv("BOLE_CACHE_DIR", str(tmp_path))  # no user profile in the way
    cfg = types.SimpleNamespace(spec=resolve_model("9b"), batches=(1, 4), context=4096, draft_vocab=draft_vocab)
    bench = types.SimpleNamespace(acceptance=types.SimpleNamespace(greedy=False), device_name="NVIDIA H200")
    return profile_pricer(cfg, bench)


def test_bench_e2e_predicts_only_from_a_profile_of_the_same_head(monkeypatch, tmp_path):
    from bole_cli.profiles import profile_path, save_profile, shipped_profiles_dir

    assert sorted(_pricer(monkeypatch, tmp_path, None).entries) == [1, 4]
    none = _pricer(monkeypatch, tmp_path, HOT)  # no profile of the hot head yet
    assert none.entries == {} and "32,768 hot tokens" in none.why
    r = runner.invoke(cli.app, ["calibrate", "--gpu", "h200", "--model", "9b", "--estimate", "--batch", "1,4",
                                "--kv", "4096", "--no-plot", "--draft-vocab", str(HOT)],
                      env={"BOLE_CACHE_DIR": str(tmp_path)})
    assert r.exit_code == 0, r.output
    hot = _pricer(monkeypatch, tmp_path, HOT)
    assert sorted(hot.entries) == [1, 4] and "vocab32768" in hot.source
    # a profile under the hot name whose field says another head (copied by hand): refused
    path = profile_path(tmp_path / "profiles", "h200", "Qwen/Qwen3.5-9B", HOT)
    save_profile(path, load_profile(profile_path(shipped_profiles_dir(), "h200", "Qwen/Qwen3.5-9B")))
    other = _pricer(monkeypatch, tmp_path, HOT)
    assert other.entries == {} and "full vocabulary" in other.why


def test_bench_e2e_takes_its_budget_from_the_profile_of_the_head_it_runs(monkeypatch, tmp_path):
    from bole_cli.bench.e2e.tree_budget import resolve_budget
    from bole_cli.calibrate.acceptance import PAPER_BUDGET

    monkeypatch.setenv("BOLE_CACHE_DIR", str(tmp_path))
    spec = resolve_model("9b")
    n, src = resolve_budget("profile", spec, "NVIDIA H200", 1, 4096, 64)
    assert "profile h200/Qwen3.5-9B.yaml" in src
    n, src = resolve_budget("profile", spec, "NVIDIA H200", 1, 4096, 256, HOT)
    assert n == PAPER_BUDGET and "drafting over 32,768 hot tokens" in src


def test_a_level_drafting_more_than_the_hot_tokens_is_refused_before_the_run():
    from bole_cli.bench.e2e import options as e2e_options
    from bole_cli.parsing import check_draft_vocab
    from bole_cli.profiles import draft_vocab_of

    opts = dict(model="9b", batch=None, context=None, depth=None, topk=None, steps=None, warmup=None,
                decoders=None, chain_depths=None, budget="96", acceptance="paper-mbpp", tree_budgets=None,
                tree_shapes="4x2,3x5", draft_vocab=4, snapshot_engine="auto", max_batch=256, max_probes=8,
                probe_nodes=None, search=False, dtype="auto", device="cpu", graphs=False, seed=0)
    with pytest.raises(InputError, match="--draft-vocab: expected an integer from 5 to 128"):
        e2e_options.check_options(tiny=True, **opts)  # the 3x5 shape drafts 5 a node
    assert e2e_options.check_options(tiny=True, **{**opts, "draft_vocab": 5}).draft_vocab == 5
    assert e2e_options.check_options(tiny=True, **{**opts, "draft_vocab": 128}).draft_vocab is None
    assert check_draft_vocab(None, 100) is None and check_draft_vocab(100, 100) is None
    assert draft_vocab_of({"draft_vocab": 999_999}, 1000) is None and draft_vocab_of({"draft_vocab": 7}, 1000) == 7


def test_serve_says_when_the_decision_and_the_served_drafter_differ_in_vocabulary():
    from bole_cli import serving
    from bole_cli.profiles import profile_path, shipped_profiles_dir

    full = load_profile(profile_path(shipped_profiles_dir(), "h200", "Qwen/Qwen3.5-9B"))
    hot = dict(full, draft_vocab=HOT)
    mapped = ["--speculative-token-map", "org/repo/hot.pt"]  # not read here (a hub path)
    note, vocab = serving.hot_token_note, resolve_model("9b").vocab
    assert note(full, "tree") is None and note(hot, "tree", mapped) is None
    assert note(hot, "none") is None and note(full, "none", mapped) is None  # nothing drafted
    assert "32,768 hot tokens" in note(hot, "chain") and "--speculative-token-map" in note(hot, "tree", ["--x"])
    assert "full vocabulary" in note(full, "tree", ["--speculative-token-map=hot.pt"])
    # a map read here: its size against the profile's
    assert note(hot, "tree", mapped, vocab, HOT) is None and note(full, "tree", mapped, vocab, vocab) is None
    assert "holds 16,384 tokens" in note(hot, "tree", mapped, vocab, 16384)
    assert "--draft-vocab 32768" in note(full, "tree", mapped, vocab, HOT)


def test_serve_reads_the_map_and_takes_the_profile_of_its_head(tmp_path, monkeypatch):
    import torch

    from bole_cli import serving

    monkeypatch.setenv("BOLE_CACHE_DIR", str(tmp_path))
    hot_map = tmp_path / "hot.pt"
    torch.save(torch.arange(HOT), hot_map)
    extra = ["--speculative-token-map", str(hot_map)]
    assert serving.token_map_size(extra) == HOT and serving.token_map_size(["--x"]) is None
    plan = serving.plan_serve("9b", gpu="h200", batch=1, dry_run=True, extra=extra)  # none of its head yet
    assert plan.report["profile"].endswith("Qwen3.5-9B.yaml")
    assert any("holds 32,768 tokens" in n for n in plan.report["notes"])
    r = runner.invoke(cli.app, ["calibrate", "--gpu", "h200", "--model", "9b", "--estimate", "--batch", "1",
                                "--kv", "4096", "--no-plot", "--draft-vocab", str(HOT)])
    assert r.exit_code == 0, r.output
    plan = serving.plan_serve("9b", gpu="h200", batch=1, dry_run=True, extra=extra)
    assert plan.report["profile"].endswith("Qwen3.5-9B-vocab32768.yaml")
    assert not any("hot tokens" in n or "holds" in n for n in plan.report["notes"])
    bad = tmp_path / "bad.pt"
    bad.write_text("not a tensor")
    with pytest.raises(InputError, match="--speculative-token-map: .*bad.pt is not a token map"):
        serving.plan_serve("9b", gpu="h200", batch=1, dry_run=True, extra=["--speculative-token-map", str(bad)])


def test_serve_reads_a_hub_map_from_the_local_cache_only(tmp_path, monkeypatch):
    """A hub path (`org/repo/file`, downloaded by SGLang at launch) is read where the local
    Hugging Face cache holds it, never fetched; not cached, or not a repository id, it is
    not read (None), as a map on no disk."""
    import sys
    import types

    import torch

    from bole_cli import serving

    cached = tmp_path / "snapshots" / "freq_32768.pt"
    cached.parent.mkdir()
    torch.save(torch.arange(HOT), cached)
    asked = []

    def try_to_load_from_cache(repo_id, filename):
        asked.append((repo_id, filename))
        if repo_id.count("/") != 1:
            raise ValueError(f"not a repository id: {repo_id}")
        return str(cached) if (repo_id, filename) == ("org/FR-Spec", "freq_32768.pt") else None

    hub = types.ModuleType("huggingface_hub")
    hub.try_to_load_from_cache = try_to_load_from_cache
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    monkeypatch.chdir(tmp_path)  # no local file of these names
    flag = "--speculative-token-map"
    assert serving.token_map_size([flag, "org/FR-Spec/freq_32768.pt"]) == HOT
    assert serving.token_map_size([flag, "org/FR-Spec/freq_16384.pt"]) is None  # not downloaded
    assert serving.token_map_size([f"{flag}=a/b/c/freq.pt"]) is None  # the hub refuses the id
    assert asked == [("org/FR-Spec", "freq_32768.pt"), ("org/FR-Spec", "freq_16384.pt"), ("a/b/c", "freq.pt")]
    cached.write_text("not a tensor")
    with pytest.raises(InputError, match=r"org/FR-Spec/freq_32768.pt \(cached as .*freq_32768.pt\) is not a token"):
        serving.token_map_size([flag, "org/FR-Spec/freq_32768.pt"])
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed: nothing read
    assert serving.token_map_size([flag, "org/FR-Spec/freq_32768.pt"]) is None


def test_serve_dry_run_carries_the_hot_token_note(tmp_path):
    from bole_cli import serving
    from bole_cli.profiles import profile_path, save_profile, shipped_profiles_dir

    prof = load_profile(profile_path(shipped_profiles_dir(), "h200", "Qwen/Qwen3.5-9B"))
    path = tmp_path / "hot.yaml"
    save_profile(path, dict(prof, draft_vocab=HOT))
    plan = serving.plan_serve("9b", profile=path, batch=1, dry_run=True)
    assert any("32,768 hot tokens" in n for n in plan.report["notes"])
    plan = serving.plan_serve("9b", profile=path, batch=1, dry_run=True,
                              extra=["--speculative-token-map", "org/maps/hot.pt"])  # a hub map not read here
    assert not any("hot tokens" in n for n in plan.report["notes"])
    assert plan.argv[-2:] == ["--speculative-token-map", "org/maps/hot.pt"]
