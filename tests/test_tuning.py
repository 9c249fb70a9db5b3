"""`bole tune-kernels` (bole_cli.tuning) and the tuned-table lookup (bole_cli.kernels.tuned_tables),
on the CPU.

The GPU path is driven with fakes: a fake evaluator for the Optuna driver, and the real
GpuEvaluator with CPU inputs and a fake graph timer (the closures then run the real kernels
under Triton's interpreter).
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from bole_cli import cli
from bole_cli.errors import InputError
from bole_cli.kernels import tuned_tables as tt
from bole_cli.kernels.buckets import BY_NODES, Bucket, nearest_bucket, parse_bucket_key
from bole_cli.tuning import space as sp
from bole_cli.tuning import tables as tb
from bole_cli.tuning.checks import Verdict
from bole_cli.tuning.plan import plan_buckets

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

GDN_9B = (16, 32, 128, 128)
GDN_27B = (16, 48, 128, 128)
H200 = "NVIDIA H200"


@pytest.fixture(autouse=True)
def _no_resolver(monkeypatch, tmp_path):
    """Every test starts and ends without a tuned-table resolver and with fresh notices,
    and with its own user cache directory (studies, locks, user profiles)."""
    monkeypatch.delenv(tt.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    saved = tt._resolver
    tt.set_resolver(None)
    tt._NOTICED.clear()
    yield
    tt.set_resolver(saved)


# ---- search space -----------------------------------------------------------------------

def test_search_space_per_kernel():
    v = sp.search_space("tree_verify", {"H": 16, "HV": 32, "K": 128, "V": 128})
    assert list(v) == ["BC", "VSPLIT", "BV", "BK", "num_warps", "num_stages"]
    assert "precision" not in v  # numerics are not a tuning knob
    assert v["BV"] == [16, 32, 64, 128] and v["BK"] == [16, 32, 64, 128]
    assert sp.space_size(v) == 3 * 3 * 4 * 4 * 3 * 2 == len(sp.candidates(v))
    c = sp.search_space("tree_commit", {"HV": 32, "K": 128, "V": 128})
    assert list(c) == ["BV", "num_warps", "num_stages"]
    conv = sp.search_space("tree_conv", {"D": 8192, "W": 4})
    assert list(conv) == ["BN", "BD", "num_warps", "num_stages"] and max(conv["BD"]) == 512
    # values past the padded dimension collapse onto one launch and are dropped
    tiny = sp.search_space("tree_verify", {"K": 32, "V": 32})
    assert tiny["BV"] == [16, 32] and tiny["BK"] == [16, 32]


def test_verify_buckets_tune_the_kernel_they_launch():
    """Trees <= 64 nodes take the one-tile kernel (VSPLIT, no BC), larger ones the blocked
    kernel (BC, no VSPLIT); a tuned config never crosses over at lookup."""
    from bole_cli.kernels.buckets import Bucket, nearest_bucket
    from bole_cli.tuning.study import builtin_default

    dims = (16, 32, 128, 128)
    tile, blocked = Bucket("tree_verify", dims, 16, 64), Bucket("tree_verify", dims, 16, 128)
    assert "VSPLIT" in builtin_default(tile) and "BC" not in builtin_default(tile)
    assert "BC" in builtin_default(blocked) and "VSPLIT" not in builtin_default(blocked)
    shape = {"H": 16, "HV": 32, "K": 128, "V": 128, "B": 16, "N": 16 * 96}
    assert nearest_bucket([tile, blocked], "tree_verify", dict(shape, T=96)) == blocked
    assert nearest_bucket([tile, blocked], "tree_verify", dict(shape, T=0)) == blocked  # size unknown
    assert nearest_bucket([tile, blocked], "tree_verify", dict(shape, T=40)) == tile
    assert nearest_bucket([blocked], "tree_verify", dict(shape, T=40)) is None
    # one-tile launches are looked up by their largest tree, not the mean tree
    small = Bucket("tree_verify", dims, 16, 16)
    skewed = {"H": 16, "HV": 32, "K": 128, "V": 128, "B": 16, "N": 64 + 15, "T": 64}
    assert nearest_bucket([small, tile], "tree_verify", skewed) == tile


def test_stale_verify_entries_are_skipped_with_a_note(tmp_path):
    """A table tuned when tree_verify had one (blocked) kernel: its BC configs on <= 64-node
    buckets must not reach the one-tile kernel."""
    from bole_cli.tuning.checks import check_sizes

    path = tmp_path / "old.yaml"
    old = {"BC": 16, "BV": 64, "BK": 32, "num_warps": 2, "num_stages": 1}
    new = {"VSPLIT": 2, "BV": 64, "BK": 64, "num_warps": 4, "num_stages": 1}
    m = (16, 32, 128, 128)
    for bucket, cfg in ((Bucket("tree_verify", m, 4, 64), old), (Bucket("tree_verify", m, 4, 32), new),
                        (Bucket("tree_verify", m, 4, 128), new)):
        tb.record_entries(path, H200, "3.9.0", _rec(bucket, cfg), create=_create())
    entries, notes = tt.load_tuned_entries([path], H200, "3.9.0")
    assert [e.bucket.nodes for e in entries] == [32]
    assert len(notes) == 2 and all("rerun bole tune-kernels" in n for n in notes)
    # the correctness case matches the kernel a config is for
    assert max(check_sizes("tree_verify", new, 16)) == 16
    assert max(check_sizes("tree_verify", old, 128)) > 64
    assert sp.search_space("tree_conv", {"D": 100, "W": 4})["BD"] == [64, 128]
    with pytest.raises(InputError, match="unknown kernel 'gdn'"):
        sp.search_space("gdn", {})


def test_search_space_includes_the_default_and_only_its_keys():
    default = {"BC": 16, "BV": 16, "num_warps": 4, "num_stages": 1}  # a kernel without BK
    s = sp.search_space("tree_verify", {"K": 128, "V": 128}, include=default)
    assert "BK" not in s and 16 in s["BV"]
    assert default in sp.candidates(s)


def test_candidates_sampling_and_fingerprint():
    s = sp.search_space("tree_commit", {"V": 128})
    first = {"BV": 32, "num_warps": 4, "num_stages": 1}
    a = sp.sample_candidates(s, 5, seed=3, first=first)
    assert a[0] == first and len(a) == 5 and len({json.dumps(c, sort_keys=True) for c in a}) == 5
    assert a == sp.sample_candidates(s, 5, seed=3, first=first)
    assert a != sp.sample_candidates(s, 5, seed=4, first=first)
    assert len(sp.sample_candidates(s, 1000)) == sp.space_size(s)
    assert sp.space_fingerprint("tree_commit", s) != sp.space_fingerprint("tree_commit", dict(s, BV=[16]))
    assert sp.format_config({"BC": 16, "num_warps": 4, "num_stages": 1}) == "BC16 w4 s1"


def test_builtin_default_ignores_an_installed_resolver():
    from bole_cli.kernels import configs
    from bole_cli.tuning.study import builtin_default

    b = Bucket("tree_verify", GDN_9B, 1, 64)
    want = {k: v for k, v in configs.launch_config("tree_verify", b.launch_shape()).items()
            if k not in ("precision", "BC", "GRAM16", "CHAIN", "SPLIT", "LEVELS", "RB")}  # one tile; not tuned
    weird = lambda kernel, shape: {"BC": 64, "BV": 16}  # noqa: E731
    tt.set_resolver(weird)
    assert builtin_default(b) == want
    assert tt._resolver is weird  # restored
    for kernel in sp.KERNELS:
        model = (8192, 4) if kernel == "tree_conv" else GDN_9B
        d = builtin_default(Bucket(kernel, model, 4, 16 if BY_NODES[kernel] else None))
        assert set(d) <= set(tt.TUNED_KEYS[kernel]) and "num_warps" in d


def test_tuned_keys_are_the_search_space_keys():
    """The lookup accepts exactly the keys the tuner searches (one list each side of the
    kernels/tuning line, kept equal here)."""
    assert {k: tuple(v) for k, v in sp.SPACES.items()} == tt.TUNED_KEYS
    assert set(sp.KERNELS) == set(tt.TUNED_KEYS)


def test_verify_path_splits_tile_and_blocked():
    from bole_cli.kernels.verify_path import is_blocked_config, is_tile_launch

    assert is_tile_launch({"T": 64}) and is_tile_launch({"T": 1})
    assert not is_tile_launch({"T": 65}) and not is_tile_launch({"T": 0}) and not is_tile_launch({})
    assert is_blocked_config({"BC": 16, "BV": 32}) and not is_blocked_config({"VSPLIT": 2, "BV": 32})
    assert not is_blocked_config({"BC": 16, "VSPLIT": 2})


def test_blocked_buckets_check_and_time_their_own_tree_size():
    """Buckets of 128, 192 and 256 nodes (issue 17): a blocked config is checked on a tree of
    the bucket's size and launched with that size promised (it sizes the kernel's register
    walk, TP), as `bole bench kernels` launches it; at <= 64 nodes the promise is withheld
    (it would pick the one-tile kernel) and the check keeps its 130-node tree."""
    from bole_cli.kernels.configs import _verify_blocked_rule
    from bole_cli.tuning.checks import check_sizes, verify_path_kwargs

    blocked = {"BC": 32, "BV": 64, "BK": 32, "num_warps": 2, "num_stages": 1}
    tile = {"VSPLIT": 1, "BV": 64, "BK": 64, "num_warps": 4, "num_stages": 1}
    for nodes in (128, 192, 256):
        assert max(check_sizes("tree_verify", blocked, nodes)) == nodes
        assert verify_path_kwargs(blocked, nodes) == {"check_trees": False, "max_nodes": nodes}
    assert max(check_sizes("tree_verify", blocked, 64)) == 130
    assert max(check_sizes("tree_verify", blocked, None)) == 130
    assert verify_path_kwargs(blocked, 64) == {"check_trees": False}
    assert verify_path_kwargs(tile, 64) == {"check_trees": False, "max_nodes": 64}
    # the built-in rule of the blocked kernel for these sizes (H200 A/B, NOTES.md "Big trees")
    dims = {"H": 16, "HV": 32, "K": 128, "V": 128, "T": 0}
    rule = {b: {n: _verify_blocked_rule({**dims, "B": b, "N": b * n}) for n in (128, 192, 256)}
            for b in (1, 4, 16, 64)}
    for b in (1, 4, 16, 64):  # SPLIT (I17-k): chunks of 32, whole value heads, 8 warps below batch 16
        assert all((rule[b][n]["BC"], rule[b][n]["BV"], rule[b][n]["num_warps"], rule[b][n]["SPLIT"])
                   == (32, 128, 8 if b < 16 else 4, 1) for n in (128, 192, 256))
    assert not _verify_blocked_rule({**dims, "B": 16, "N": 16 * 40}).get("SPLIT")  # small trees: v3's rule


def test_first_launch_installs_the_tables_once(monkeypatch, capsys):
    """launch_config's first call installs this GPU's tables; a failing install is a
    one-line note, never an error, and is not retried."""
    from bole_cli.kernels import configs

    calls = []

    def broken_install():
        calls.append(1)
        raise InputError("k.yaml: not valid YAML")

    monkeypatch.setattr(tt, "install_tuned_tables", broken_install)
    monkeypatch.setattr(tt, "_autoload", True)
    shape = _shape(4, 64)
    builtin = configs.launch_config("tree_verify", shape)
    assert configs.launch_config("tree_verify", shape) == builtin and calls == [1]
    assert capsys.readouterr().err == "bole: note: tuned kernel tables not loaded (k.yaml: not valid YAML)\n"
    monkeypatch.setattr(tt, "_autoload", True)
    monkeypatch.setattr(tt, "install_tuned_tables", lambda: tt.set_resolver(lambda k, s: {"num_warps": 8}))
    assert configs.launch_config("tree_verify", shape)["num_warps"] == 8 and tt._autoload is False


# ---- buckets --------------------------------------------------------------------------

def test_bucket_keys_round_trip_and_errors():
    for b in (Bucket("tree_verify", GDN_9B, 4, 64), Bucket("tree_commit", GDN_27B, 16),
              Bucket("tree_commit_replay", GDN_9B, 96, 16), Bucket("tree_conv", (8192, 4), 1, 16)):
        assert parse_bucket_key(b.key) == b
    assert Bucket("tree_verify", GDN_9B, 4, 64).key == "tree_verify/H16-HV32-K128-V128/B4/N64"
    assert Bucket("tree_commit_replay", GDN_9B, 96, 16).key == "tree_commit_replay/H16-HV32-K128-V128/B96/N16"
    assert Bucket("tree_commit", GDN_9B, 4).key == "tree_commit/H16-HV32-K128-V128/B4"
    for bad in ("verify/T64/HV32", "tree_verify/H16-HV32-K128-V128/B4", "tree_commit/H16-HV32-K128-V128/B4/N8",
                "tree_commit_replay/H16-HV32-K128-V128/B4",
                "tree_conv/H16-HV32-K128-V128/B4/N8", "tree_verify/HV32-H16-K128-V128/B4/N8",
                "tree_verify/H16-HV32-K128-V128/B0/N8"):
        with pytest.raises(InputError):
            parse_bucket_key(bad)


def test_plan_dedupes_models_sharing_a_shape():
    from bole_cli.catalog.models import resolve_model

    specs = [resolve_model(m) for m in ("4b", "9b", "27b")]
    kernels = ["tree_verify", "tree_commit_replay", "tree_commit", "tree_conv"]
    buckets, owners = plan_buckets(specs, kernels, [1, 4], [16, 64])
    assert owners[("tree_verify", GDN_9B)] == ["Qwen/Qwen3.5-4B", "Qwen/Qwen3.5-9B"]
    assert owners[("tree_conv", (10240, 4))] == ["Qwen/Qwen3.5-27B"]
    kinds = [b.kernel for b in buckets]
    assert kinds.count("tree_verify") == 2 * 2 * 2 and kinds.count("tree_commit") == 2 * 2
    assert kinds.count("tree_conv") == 2 * 2 * 2 and len(set(buckets)) == len(buckets)
    # the served commit runs over every GDN layer at once: planned at batch x GDN layers
    replay = {(b.model, b.batch, b.nodes) for b in buckets if b.kernel == "tree_commit_replay"}
    layers = {m: resolve_model(m).n_gdn_layers for m in ("9b", "27b")}
    assert layers["9b"] == resolve_model("4b").n_gdn_layers  # 4B and 9B share one set of buckets
    assert replay == {(GDN_9B if m == "9b" else GDN_27B, b * layers[m], n)
                      for m in ("9b", "27b") for b in (1, 4) for n in (16, 64)}


# ---- lookup ------------------------------------------------------------------------------

def _grid(kernel="tree_verify", model=GDN_9B, batches=(1, 4, 16, 64), nodes=(16, 64)):
    return [Bucket(kernel, model, b, n) for b in batches for n in nodes]


def _shape(b=4, n_per=64, hv=32, h=None, k=128, v=128):
    s = {"K": k, "V": v, "HV": hv, "B": b, "N": b * n_per, "T": n_per}  # T: as tree_verify promises
    if h is not None:
        s["H"] = h
    return s


def test_lookup_exact_nearest_and_missing():
    grid = _grid() + _grid(model=GDN_27B)
    assert nearest_bucket(grid, "tree_verify", _shape(4, 64, h=16)) == Bucket("tree_verify", GDN_9B, 4, 64)
    assert nearest_bucket(grid, "tree_verify", _shape(4, 64)) == Bucket("tree_verify", GDN_9B, 4, 64)  # no H
    # batch 8 is as far (log) from 4 as from 16: ties go to the larger
    assert nearest_bucket(grid, "tree_verify", _shape(8, 64)).batch == 16
    assert nearest_bucket(grid, "tree_verify", _shape(5, 64)).batch == 4
    assert nearest_bucket(grid, "tree_verify", _shape(300, 40)) == Bucket("tree_verify", GDN_9B, 64, 64)
    assert nearest_bucket(grid, "tree_verify", _shape(1, 20)).nodes == 16
    # another value-head count: the nearest one with the same K and V
    assert nearest_bucket(grid, "tree_verify", _shape(4, 64, hv=40)).model == GDN_27B
    assert nearest_bucket(grid, "tree_verify", _shape(4, 64, hv=24)).model == GDN_9B
    # nothing applicable: another head size, or a kernel without entries
    assert nearest_bucket(grid, "tree_verify", _shape(4, 64, k=64)) is None
    assert nearest_bucket(grid, "tree_commit", _shape(4, 64)) is None
    assert nearest_bucket([], "tree_verify", _shape()) is None


def test_lookup_commit_and_conv_shapes():
    commits = [Bucket("tree_commit", GDN_9B, b) for b in (1, 4, 16, 64)]
    assert nearest_bucket(commits, "tree_commit", {"K": 128, "V": 128, "HV": 32, "B": 2, "L": 8}).batch == 16
    assert nearest_bucket(commits, "tree_commit", {"K": 128, "V": 128, "HV": 32, "B": 1, "L": 1}).batch == 1
    # the replay commit's batch is B x L too, and its nodes the promised tree size (N / B)
    replays = _grid("tree_commit_replay", batches=(24, 96, 384), nodes=(16, 64))
    shape = {"K": 128, "V": 128, "HV": 32, "B": 4, "L": 24, "N": 4 * 16}
    assert nearest_bucket(replays, "tree_commit_replay", shape) == Bucket("tree_commit_replay", GDN_9B, 96, 16)
    assert nearest_bucket(replays, "tree_commit_replay", dict(shape, B=16, N=16 * 64)) == \
        Bucket("tree_commit_replay", GDN_9B, 384, 64)
    for b in replays:  # a bucket's own launch shape finds it
        assert nearest_bucket(replays, "tree_commit_replay", b.launch_shape()) == b
    convs = _grid("tree_conv", (8192, 4)) + _grid("tree_conv", (10240, 4))
    assert nearest_bucket(convs, "tree_conv", {"D": 10240, "W": 4, "B": 16, "N": 256}) == \
        Bucket("tree_conv", (10240, 4), 16, 16)
    assert nearest_bucket(convs, "tree_conv", {"D": 9000, "W": 4, "B": 1, "N": 64}).model == (8192, 4)
    assert nearest_bucket(convs, "tree_conv", {"D": 8192, "W": 2, "B": 1, "N": 64}) is None


def _entry(bucket, cfg, default=False, version="3.9.0"):
    return tt.TunedEntry(bucket, cfg, default, 10.0, 12.0, version)


def test_a_tuned_replay_entry_reaches_the_served_commit(monkeypatch):
    """The replay commit's launch (every layer at once, the tree size promised) picks its
    bucket's tuned config."""
    import torch

    from bole_cli import kernels
    from bole_cli.kernels import configs

    seen = []
    real = configs.launch_config

    def spy(kernel, shape, override=None):
        cfg = real(kernel, shape, override)
        if kernel == "tree_commit_replay":
            seen.append(dict(cfg))
        return cfg

    import sys

    monkeypatch.setattr(sys.modules["bole_cli.kernels.tree_commit_replay"], "launch_config", spy)
    model = (1, 2, 16, 16)
    tt.set_resolver(tt.make_resolver([
        _entry(Bucket("tree_commit_replay", model, 6, 4), {"BV": 32, "num_warps": 2, "num_stages": 2}),
        _entry(Bucket("tree_commit_replay", model, 6, 64), {"BV": 16, "num_warps": 4, "num_stages": 1})]))
    try:
        L, B, T = 3, 2, 4
        state = torch.randn(L, B, 2, 16, 16)
        k, v = torch.randn(L, B * T, 1, 16), torch.randn(L, B * T, 2, 16)
        g, beta = -torch.rand(L, B * T, 2), torch.rand(L, B * T, 2)
        parents = torch.tensor([-1, 0, 1, 1] * B, dtype=torch.int32)
        cu = torch.arange(0, B * T + 1, T, dtype=torch.int32)
        kernels.tree_commit_replay(state, torch.arange(B, dtype=torch.int32), k, v, g, beta, parents, cu,
                                   torch.tensor([3, 1], dtype=torch.int32), max_nodes=T, max_depth=2)
    finally:
        tt.set_resolver(None)
    assert [(c["BV"], c["num_warps"], c["num_stages"]) for c in seen] == [(32, 2, 2)]


def test_resolver_feeds_launch_config():
    from bole_cli.kernels import configs

    tuned = {"BC": 64, "BV": 64, "BK": 64, "num_warps": 8, "num_stages": 2}
    entries = [_entry(Bucket("tree_verify", GDN_9B, 4, 64), tuned),
               _entry(Bucket("tree_verify", GDN_9B, 64, 64), {"BC": 32, "BV": 32, "BK": 32, "num_warps": 2,
                                                               "num_stages": 1}, default=True)]
    resolver = tt.make_resolver(entries)
    tt.set_resolver(resolver)
    cfg = configs.launch_config("tree_verify", _shape(4, 64))
    assert {k: cfg[k] for k in tuned} == tuned and cfg["precision"] is None
    # a bucket where the built-in config won defers to the built-in rule for the exact shape
    builtin = (tt.set_resolver(None), configs.launch_config("tree_verify", _shape(64, 64)))[1]
    tt.set_resolver(resolver)
    assert configs.launch_config("tree_verify", _shape(64, 64)) == builtin
    # an explicit override still wins over the table
    assert configs.launch_config("tree_verify", _shape(4, 64), {"BC": 16})["BC"] == 16
    # the tables hold the served precision's configs: a tf32x3 launch keeps the built-in rules
    assert configs.launch_config("tree_verify", _shape(4, 64), {"precision": "tf32"})["BC"] == 64
    tt.set_resolver(None)
    plain = configs.launch_config("tree_verify", _shape(4, 64), {"precision": "tf32x3"})
    tt.set_resolver(resolver)
    assert configs.launch_config("tree_verify", _shape(4, 64), {"precision": "tf32x3"}) == plain
    assert resolver("tree_verify", _shape(4, 64)) is resolver("tree_verify", _shape(4, 64))  # memoised
    assert resolver("tree_commit", {"K": 128, "V": 128, "HV": 32, "B": 4, "L": 1}) is None


# ---- tables on disk -----------------------------------------------------------------------

def _create(gpu="h200"):
    return tb.new_kernels_profile(gpu, H200, torch_version="2.13", triton_version="3.9.0", command="test")


def _rec(bucket, cfg, default=False):
    return {bucket.key: {"config": cfg, "us": 10.0, "default_us": 12.0, "speedup": 1.2, "default": default}}


V4 = Bucket("tree_verify", GDN_9B, 4, 64)
CFG = {"VSPLIT": 1, "BV": 64, "BK": 32, "num_warps": 4, "num_stages": 1}


def test_record_creates_a_valid_gpu_profile_and_merges(tmp_path):
    from bole_cli.profiles import load_profile

    path = tt.kernels_profile_path(tmp_path, "h200")
    assert path == tmp_path / "h200" / "kernels.yaml"
    tb.record_entries(path, H200, "3.9.0", _rec(V4, CFG), create=_create())
    data = load_profile(path)
    assert data["gpu"] == "h200" and data["model"] == "*" and data["provenance"]["kind"] == "measured"
    assert data["kernels"]["NVIDIA H200 | triton 3.9.0"][V4.key]["config"] == CFG
    # another bucket, another Triton version and another device: nothing is lost
    c4 = Bucket("tree_commit", GDN_9B, 4)
    tb.record_entries(path, H200, "3.9.0", _rec(c4, {"BV": 16, "num_warps": 2, "num_stages": 1}), create=_create())
    tb.record_entries(path, H200, "3.5.0", _rec(V4, dict(CFG, VSPLIT=2)), create=_create())
    tb.record_entries(path, "NVIDIA A100-SXM4-80GB", "3.9.0", _rec(V4, dict(CFG, VSPLIT=4)), create=_create())
    k = load_profile(path)["kernels"]
    assert set(k["NVIDIA H200 | triton 3.9.0"]) == {V4.key, c4.key}
    assert k["NVIDIA H200 | triton 3.5.0"][V4.key]["config"]["VSPLIT"] == 2
    assert k["NVIDIA A100-SXM4-80GB | triton 3.9.0"][V4.key]["config"]["VSPLIT"] == 4
    assert [p.name for p in path.parent.iterdir()] == ["kernels.yaml"]  # no temp or lock files
    with pytest.raises(InputError, match="holds gpu 'h200', not 'a100'"):
        tb.record_entries(path, H200, "3.9.0", _rec(V4, CFG), create=_create("a100"))
    with pytest.raises(InputError, match="not a bucket key"):
        tb.record_entries(path, H200, "3.9.0", {"verify/T64": {"config": CFG}}, create=_create())


def test_merge_into_a_model_profile_keeps_every_other_section(tmp_path):
    from bole_cli.profiles import load_profile, profile_path, shipped_profiles_dir

    src = profile_path(shipped_profiles_dir(), "h200", "Qwen3.5-9B")
    path = tmp_path / "Qwen3.5-9B.yaml"
    path.write_text(src.read_text())
    before = load_profile(path)
    before["kernels"] = {"someone else's key": {"x": 1}}
    from bole_cli.profiles import save_profile

    save_profile(path, before)
    tb.record_entries(path, H200, "3.9.0", _rec(V4, CFG), create=_create())
    after = load_profile(path)
    assert {k: v for k, v in after.items() if k != "kernels"} == {k: v for k, v in before.items() if k != "kernels"}
    assert after["kernels"]["someone else's key"] == {"x": 1}
    assert after["kernels"]["NVIDIA H200 | triton 3.9.0"][V4.key]["config"] == CFG


def test_load_priorities_and_bad_entries(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    tb.record_entries(a, H200, "3.5.0", _rec(V4, dict(CFG, VSPLIT=2)), create=_create())
    tb.record_entries(b, H200, "3.9.0", _rec(V4, dict(CFG, VSPLIT=4)), create=_create())
    entries, _ = tt.load_tuned_entries([a, b], H200, "3.9.0")
    assert [e.config["VSPLIT"] for e in entries] == [4]  # the running Triton version wins
    entries, _ = tt.load_tuned_entries([a, b], "nvidia  h200", "3.4.0")  # names compare loosely
    assert [e.config["VSPLIT"] for e in entries] == [2]  # else the nearest Triton release
    tb.record_entries(b, H200, "3.5.0", _rec(V4, dict(CFG, VSPLIT=1)), create=_create())
    entries, _ = tt.load_tuned_entries([a, b], H200, "3.5.0")
    assert [e.config["VSPLIT"] for e in entries] == [2]  # equal rank: the earlier file
    # a malformed entry is skipped with a note, its neighbours still load
    data = yaml.safe_load(b.read_text())
    data["kernels"]["NVIDIA H200 | triton 3.9.0"]["tree_verify/H16-HV32-K128-V128/B1/N16"] = {"config": {"BC": "x"}}
    b.write_text(yaml.safe_dump(data))
    entries, notes = tt.load_tuned_entries([b], H200, "3.9.0")
    assert [e.bucket for e in entries] == [V4] and len(notes) == 1 and "B1/N16" in notes[0]
    (tmp_path / "broken.yaml").write_text("bole_profile: [\n")
    entries, notes = tt.load_tuned_entries([tmp_path / "broken.yaml", tmp_path / "missing.yaml", b], H200, "3.9.0")
    assert [e.bucket for e in entries] == [V4] and "not valid YAML" in notes[0]


def test_held_configs_are_the_entries_in_force(tmp_path):
    """What a retune tries first: per bucket the entry the lookup would use, from any file or
    Triton version, but not where the built-in config won."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    c4 = Bucket("tree_commit", GDN_9B, 4)
    tb.record_entries(a, H200, "3.5.0", _rec(V4, dict(CFG, VSPLIT=2)), create=_create())
    tb.record_entries(b, H200, "3.9.0", _rec(V4, dict(CFG, VSPLIT=4)), create=_create())
    tb.record_entries(b, H200, "3.9.0", _rec(c4, {"BV": 16, "num_warps": 2, "num_stages": 1}, default=True),
                      create=_create())
    assert tb.held_configs([a, b], H200, "3.9.0") == {V4.key: dict(CFG, VSPLIT=4)}
    assert tb.held_configs([a], H200, "3.9.0") == {V4.key: dict(CFG, VSPLIT=2)}
    assert tb.held_configs([tmp_path / "missing.yaml"], H200, "3.9.0") == {}


def test_install_tuned_tables(tmp_path, capsys, monkeypatch):
    from bole_cli.kernels import configs

    path = tmp_path / "k.yaml"
    tb.record_entries(path, H200, "3.9.0", _rec(V4, dict(CFG, num_warps=8)), create=_create())
    info = tt.install_tuned_tables(H200, paths=[path], triton_version="3.9.0")
    assert len(info.entries) == 1 and configs.launch_config("tree_verify", _shape(4, 64))["num_warps"] == 8
    assert capsys.readouterr().err == ""
    # another Triton version: used, with a one-line notice
    tt.install_tuned_tables(H200, paths=[path], triton_version="3.10.0")
    assert configs.launch_config("tree_verify", _shape(4, 64))["num_warps"] == 8
    assert "made with triton 3.9.0 (running 3.10.0)" in capsys.readouterr().err
    # no table for this GPU: built-in configs and one notice, once
    for _ in range(2):
        info = tt.install_tuned_tables("NVIDIA B200", paths=[path], triton_version="3.9.0")
    assert info.entries == [] and tt._resolver is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bole: note: no tuned kernel table for NVIDIA B200")
    # the environment switch and file
    monkeypatch.setenv(tt.ENV_VAR, "off")
    tt.set_resolver(lambda k, s: None)
    assert tt.install_tuned_tables(H200, paths=[path]) is None and tt._resolver is None
    monkeypatch.setenv(tt.ENV_VAR, str(path))
    assert tt.table_paths(H200)[0] == path
    assert tt.table_paths(H200)[-1].as_posix().endswith("profiles/h200/kernels.yaml")


def test_install_without_cuda_does_nothing(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert tt.install_tuned_tables() is None
    assert capsys.readouterr().err == ""


def test_gpu_key_for_device_names():
    assert tt.gpu_key_for("NVIDIA H200") == "h200"
    assert tt.gpu_key_for("NVIDIA GeForce RTX 4090") == "nvidia_geforce_rtx_4090"
    assert tt.parse_device_key(tt.device_key(" NVIDIA  H200 ", "3.9.0")) == ("NVIDIA H200", "3.9.0")


# ---- the Optuna driver with a fake evaluator -------------------------------------------------

class FakeEvaluator:
    """tree_commit-like space; time = a synthetic cost; some configs are wrong or fail."""

    device_name, triton_version = "Fake GPU", "3.9.0"

    def __init__(self, cost=None, wrong=lambda c: c["BV"] == 64 and c["num_warps"] == 2,
                 broken=lambda c: c["num_stages"] == 3):
        self.cost = cost or (lambda c: 10.0 + abs(c["BV"] - 128) / 8 + abs(c["num_warps"] - 8) + c["num_stages"])
        self.wrong, self.broken = wrong, broken
        self.checked, self.timed = [], []

    def default_config(self, bucket):
        return {"BV": 32, "num_warps": 4, "num_stages": 1}

    def prepare(self, bucket):
        self.prepared = bucket

    def release(self):
        self.prepared = None

    def check(self, bucket, config):
        self.checked.append(dict(config))
        if self.broken(config):
            return Verdict(False, "skipped", "OutOfResources: shared memory")
        if self.wrong(config):
            return Verdict(False, "rejected", "state rel err 3.0e-01 > 0.01", 0.3)
        return Verdict(True, "ok", "", 1e-6)

    def time(self, bucket, config, rep_ms):
        assert self.prepared == bucket
        self.timed.append((dict(config), rep_ms))
        return self.cost(config)


@pytest.fixture
def optuna():
    from bole_cli.tuning.study import import_optuna

    return import_optuna()


def _storage(optuna, tmp_path, kind="journal"):
    from bole_cli.tuning.study import open_storage

    return open_storage(optuna, tmp_path / "studies.sqlite3", prefer=kind)[0]


C4 = Bucket("tree_commit", GDN_9B, 4)


def test_tune_bucket_rejects_never_times_and_never_loses(optuna, tmp_path):
    from bole_cli.tuning.study import TuneSettings, tune_bucket

    ev = FakeEvaluator()
    res = tune_bucket(optuna, _storage(optuna, tmp_path), C4, ev, TuneSettings(trials=20, seed=1))
    timed = [c for c, _ in ev.timed]
    assert not [c for c in timed if ev.wrong(c) or ev.broken(c)]  # a rejected config is never timed
    assert ev.checked[0] == ev.default_config(C4)  # the default goes first ...
    assert (ev.default_config(C4), 40.0) in ev.timed  # ... and is fully timed
    assert sum(res.counts[k] for k in ("timed", "slow", "rejected", "skipped")) == 20
    assert res.counts["rejected"] + res.counts["skipped"] >= 1
    assert not res.is_default and res.speedup > 1 and res.us == ev.cost(res.config)
    assert res.default_us == ev.cost(ev.default_config(C4))
    assert res.us == min(ev.cost(c) for c in timed)


def test_slow_trials_are_pruned_after_the_quick_timing(optuna, tmp_path):
    from bole_cli.tuning.study import TuneSettings, tune_bucket

    cost = lambda c: 10.0 if c == {"BV": 32, "num_warps": 4, "num_stages": 1} else (100.0 if c["BV"] == 16 else 11.0)  # noqa: E731
    ev = FakeEvaluator(cost=cost, wrong=lambda c: False, broken=lambda c: False)
    res = tune_bucket(optuna, _storage(optuna, tmp_path), C4, ev, TuneSettings(trials=16, sampler="grid"))
    slow = [c for c, _ in ev.timed if c["BV"] == 16]
    assert res.counts["slow"] >= 1 and slow
    for c in slow:  # only the quick timing, never the full one
        assert (c, 40.0) not in ev.timed and (c, 10.0) in ev.timed
    assert res.is_default and res.speedup == 1.0  # nothing beat the default


def test_default_kept_unless_clearly_beaten(optuna, tmp_path):
    from bole_cli.tuning.study import TuneSettings, tune_bucket

    default = {"BV": 32, "num_warps": 4, "num_stages": 1}
    ev = FakeEvaluator(cost=lambda c: 10.0 if c == default else 9.95, wrong=lambda c: False,
                       broken=lambda c: False)
    res = tune_bucket(optuna, _storage(optuna, tmp_path), C4, ev, TuneSettings(trials=6))
    assert res.best_trial_us == 9.95 and res.is_default and res.config == default and res.us == 10.0


def test_resume_after_interruption(optuna, tmp_path):
    from bole_cli.tuning.study import TuneSettings, study_name, tune_bucket

    storage = _storage(optuna, tmp_path)
    ev = FakeEvaluator()
    tune_bucket(optuna, storage, C4, ev, TuneSettings(trials=5))
    first = len(ev.checked)
    # a process killed mid-trial leaves a RUNNING trial behind
    name = study_name(ev.device_name, ev.triton_version, C4,
                      sp.search_space("tree_commit", C4.dims, include=ev.default_config(C4)))
    optuna.load_study(study_name=name, storage=storage).ask()
    ev2 = FakeEvaluator()
    res = tune_bucket(optuna, _storage(optuna, tmp_path), C4, ev2, TuneSettings(trials=9))
    assert first == 5 and len(ev2.checked) == 4  # only the new trials are evaluated
    assert ev.default_config(C4) not in ev2.checked
    assert sum(res.counts[k] for k in ("timed", "slow", "rejected", "skipped")) == 9
    states = {t.state.name for t in optuna.load_study(study_name=name, storage=storage).trials}
    assert "RUNNING" not in states
    # --fresh starts over
    ev3 = FakeEvaluator()
    tune_bucket(optuna, storage, C4, ev3, TuneSettings(trials=3), fresh=True)
    assert ev3.checked[0] == ev.default_config(C4) and len(ev3.checked) == 3


def test_a_kernel_change_starts_new_studies(optuna, tmp_path, monkeypatch):
    """Studies are keyed by the kernel's source: timings of an older kernel are never reused."""
    from bole_cli.tuning import study as study_mod

    storage = _storage(optuna, tmp_path)
    study_mod.tune_bucket(optuna, storage, C4, FakeEvaluator(), study_mod.TuneSettings(trials=3))
    ev = FakeEvaluator()
    study_mod.tune_bucket(optuna, storage, C4, ev, study_mod.TuneSettings(trials=3))
    assert ev.checked == []  # same source: resumed, nothing re-evaluated
    assert study_mod.kernel_fingerprint("tree_commit") != study_mod.kernel_fingerprint("tree_verify")
    monkeypatch.setattr(study_mod, "kernel_fingerprint", lambda kernel: "0badcafe")
    ev = FakeEvaluator()
    study_mod.tune_bucket(optuna, storage, C4, ev, study_mod.TuneSettings(trials=3))
    assert ev.checked[0] == ev.default_config(C4) and len(ev.checked) == 3


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_storage_kinds_resume(optuna, tmp_path, kind):
    from bole_cli.tuning.study import TuneSettings, open_storage, tune_bucket

    if kind == "sqlite":
        pytest.importorskip("sqlalchemy")
        pytest.importorskip("alembic")
    storage, path, got = open_storage(optuna, tmp_path / "s.sqlite3", prefer="auto" if kind == "sqlite" else kind)
    assert got == kind and path.suffix == (".sqlite3" if kind == "sqlite" else ".journal")
    tune_bucket(optuna, storage, C4, FakeEvaluator(), TuneSettings(trials=3))
    assert path.exists()
    ev = FakeEvaluator()
    tune_bucket(optuna, open_storage(optuna, tmp_path / "s.sqlite3", prefer=kind)[0], C4, ev, TuneSettings(trials=3))
    assert ev.checked == []


def test_budget_hints_and_failed_default(optuna, tmp_path):
    import time

    from bole_cli.tuning.study import TuneSettings, run_tuning, tune_bucket

    ev = FakeEvaluator()
    res = tune_bucket(optuna, _storage(optuna, tmp_path), C4, ev, TuneSettings(trials=12),
                      deadline=time.monotonic() - 1)
    assert res.cut_short and ev.checked == [ev.default_config(C4)]
    hint = {"BV": 128, "num_warps": 8, "num_stages": 1}
    ev = FakeEvaluator()
    tune_bucket(optuna, _storage(optuna, tmp_path), Bucket("tree_commit", GDN_9B, 16), ev, TuneSettings(trials=3),
                hints=[hint, {"BV": 999, "num_warps": 8, "num_stages": 1}])
    assert ev.checked[:2] == [ev.default_config(C4), hint]  # out-of-space hints are dropped
    # the entry a table already holds for a bucket is tried right after the default
    held = {"BV": 16, "num_warps": 2, "num_stages": 2}
    ev = FakeEvaluator()
    b4 = Bucket("tree_commit", GDN_9B, 4)
    run_tuning(optuna, _storage(optuna, tmp_path / "held"), [b4, Bucket("tree_commit", GDN_9B, 1)], ev,
               TuneSettings(trials=2), incumbents={b4.key: held})
    assert ev.checked[:2] == [ev.default_config(b4), held] and ev.checked.count(held) == 1
    ev = FakeEvaluator(wrong=lambda c: c["BV"] == 32)
    results = run_tuning(optuna, _storage(optuna, tmp_path), [Bucket("tree_commit", GDN_9B, 64)], ev,
                         TuneSettings(trials=3))
    assert results[0].failed.startswith("the built-in config failed its check")


def test_estimate_is_sane():
    from bole_cli.tuning.study import estimate_seconds

    buckets = _grid() + [Bucket("tree_commit", GDN_9B, b) for b in (1, 4, 16, 64)]
    est = estimate_seconds(buckets, 12)
    assert 30 < est < 600
    assert estimate_seconds(buckets, 24) > est and estimate_seconds(buckets[:2], 12) < est
    assert estimate_seconds(buckets, 12, "grid") < est


# ---- the real GpuEvaluator on the CPU: CPU inputs, a fake graph timer ---------------------------

def cpu_layer_inputs(torch, dims, batch, nodes, seed, act_dtype, state_dtype):
    """bole_cli.timing.LayerInputs' attributes, on the CPU."""
    from bole_cli.timing import depth_promise, tree_parents

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    n = batch * nodes
    par = [p for _ in range(batch) for p in tree_parents("random", nodes, rng)]
    h, hv, kd, vd = dims["H"], dims["HV"], dims["K"], dims["V"]
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return SimpleNamespace(
        nodes=nodes, max_depth=depth_promise("random", nodes),
        parents=torch.tensor(par, dtype=torch.int32), cu=torch.arange(0, n + 1, nodes, dtype=torch.int32),
        q=r(n, h, kd).to(act_dtype), k=r(n, h, kd).to(act_dtype), v=r(n, hv, vd).to(act_dtype),
        a=r(n, hv).to(act_dtype), b=r(n, hv).to(act_dtype), A_log=torch.rand(hv, generator=gen) * 2 - 1,
        dt_bias=r(hv), pool=r(batch + 1, hv, vd, kd).to(state_dtype),
        slots=torch.randperm(batch + 1, generator=gen)[:batch].to(torch.int32),
        accepted=torch.tensor([rng.randint(0, nodes - 1) for _ in range(batch)], dtype=torch.int32))


class FakeTimer:
    def __init__(self):
        self.captures = 0

    def capture(self, fns):
        for fn in fns:
            fn()  # the real kernels, under the interpreter
        self.captures += 1
        return len(fns)

    def measure(self, handle, rep_ms, warmup_ms):
        return 0.004 * handle  # ms per replay of `handle` launches -> 4 us per launch


@pytest.mark.parametrize("kernel,model,nodes", [("tree_verify", (1, 2, 32, 32), 8), ("tree_commit", (1, 2, 32, 32), None),
                                                ("tree_commit_replay", (1, 2, 32, 32), 8),
                                                ("tree_commit_replay", (1, 2, 32, 32), None),
                                                ("tree_conv", (128, 4), 8)])
def test_gpu_evaluator_on_cpu_with_fakes(kernel, model, nodes):
    """The real evaluator's closures on CPU inputs; a replay bucket that names no node count
    (as the GPU suite's small run builds one) times the sets prepare built (64 nodes)."""
    import torch

    from bole_cli.tuning.gpu import GpuEvaluator

    timer = FakeTimer()
    ev = GpuEvaluator(device="cpu", act_dtype="float32", rotate=2, timer=timer, device_name="cpu",
                      make_layer_inputs=cpu_layer_inputs)
    b = Bucket(kernel, model, 2, nodes)
    default = ev.default_config(b)
    ev.prepare(b)
    for out in ev._outs if kernel == "tree_verify" else ():
        out.u.fill_(float("nan"))
    assert ev.check(b, default).ok
    before = [getattr(s, "pool", getattr(s, "conv_state", None)).clone() for s in ev._sets]
    assert ev.time(b, default, 10.0) == pytest.approx(4.0)
    assert ev.time(b, default, 40.0) == pytest.approx(4.0) and timer.captures == 1  # one capture, two timings
    if kernel == "tree_verify":  # timed as served: o written, the factors not
        assert all(torch.isfinite(o.o).all() and not torch.isfinite(o.u).any() for o in ev._outs)
    else:  # the commits ran on the prepared inputs
        after = [getattr(s, "pool", getattr(s, "conv_state", None)) for s in ev._sets]
        assert any(not torch.equal(x, y) for x, y in zip(before, after))
    other = dict(default, num_warps=2)
    ev.time(b, other, 10.0)
    ev.time(b, default, 10.0)
    assert timer.captures == 2  # the best and the default alternate without re-capturing
    ev.release()
    assert ev._sets == [] and ev._graphs == {}


@pytest.mark.parametrize("kernel", ["tree_commit", "tree_commit_replay"])
def test_check_rejects_a_wrong_commit_and_skips_a_failing_one(kernel):
    import torch

    from bole_cli.tuning.checks import build_check_case, run_check

    case = build_check_case(kernel, {"H": 1, "HV": 2, "K": 16, "V": 16}, act_dtype=torch.float32,
                            sizes=(12, 5))
    names = [kernel] if kernel == "tree_commit" else ["tree_commit_replay_gated", "tree_commit_replay"]

    def mod(fn):
        return SimpleNamespace(**{name: fn for name in names})

    def wrong_commit(state, *args, **kw):
        state.mul_(1.5)

    def broken_commit(*args, **kw):
        from triton.runtime.errors import OutOfResources

        raise OutOfResources(300000, 232448, "shared memory")

    def leaky_commit(state, *args, **kw):  # right values, but it writes a slot that accepted nothing
        state.copy_(case["ref_state"])
        untouched = [s for s in range(state.shape[0]) if s not in case["slots"].tolist()]
        state[untouched[0]] *= 1 + 1e-6

    v = run_check(kernel, case, {"BV": 16}, kernels_mod=mod(wrong_commit))
    assert (v.ok, v.outcome) == (False, "rejected") and "state rel err" in v.reason
    v = run_check(kernel, case, {"BV": 16}, kernels_mod=mod(leaky_commit))
    assert (v.ok, v.reason) == (False, "a slot that accepted nothing was written")
    v = run_check(kernel, case, {"BV": 16}, kernels_mod=mod(broken_commit))
    assert (v.ok, v.outcome) == (False, "skipped") and "OutOfResources" in v.reason
    assert run_check(kernel, case, {"BV": 16}).ok
    if kernel == "tree_commit_replay":  # the plug-in's ungated launch is checked too
        from bole_cli import kernels

        v = run_check(kernel, case, {"BV": 16}, kernels_mod=SimpleNamespace(
            tree_commit_replay_gated=kernels.tree_commit_replay_gated, tree_commit_replay=wrong_commit))
        assert (v.ok, v.outcome) == (False, "rejected") and v.reason.startswith("ungated state rel err")


def test_the_replay_gate_checks_the_timed_walk(monkeypatch):
    """The replay commit is checked under the promises its timed launches make (the compiled
    walk follows them), on trees no larger than its bucket's."""
    import torch

    from bole_cli import kernels
    from bole_cli.timing import depth_promise
    from bole_cli.tuning.checks import build_check_case, check_sizes, run_check

    assert max(check_sizes("tree_commit_replay", {}, 16)) == 16 and max(check_sizes("tree_commit_replay", {}, 256)) == 256
    case = build_check_case("tree_commit_replay", {"H": 1, "HV": 2, "K": 16, "V": 16}, act_dtype=torch.float32,
                            sizes=check_sizes("tree_commit_replay", {}, 16))
    seen = []

    def spy(fn):
        def call(*args, **kw):
            seen.append((kw.get("max_nodes"), kw.get("max_depth")))
            return fn(*args, **kw)
        return call

    v = run_check("tree_commit_replay", case, {"BV": 16}, kernels_mod=SimpleNamespace(
        tree_commit_replay_gated=spy(kernels.tree_commit_replay_gated),
        tree_commit_replay=spy(kernels.tree_commit_replay)))
    assert v.ok and seen == [(16, depth_promise("random", 16))] * 2


@pytest.mark.parametrize("free, want", [(10 ** 9, 3), (25, 1), (35, 2)])
def test_gpu_evaluator_times_as_many_sets_as_memory_holds(free, want):
    """A set (10 bytes here) is added only while two more would fit; one always is."""
    from bole_cli.tuning.gpu import GpuEvaluator

    built = []

    def inputs(*args):
        built.append(1)
        return cpu_layer_inputs(*args)

    def memory():
        return 10 * len(built), free - 10 * len(built)

    ev = GpuEvaluator(device="cpu", act_dtype="float32", rotate=3, timer=FakeTimer(), device_name="cpu",
                      make_layer_inputs=inputs, memory=memory)
    b = Bucket("tree_commit_replay", (1, 2, 32, 32), 2, 8)
    ev.prepare(b)
    assert len(ev._sets) == want and ev._outs == [None] * want  # the replay reads no verify outputs
    assert ev.time(b, ev.default_config(b), 10.0) == pytest.approx(4.0)  # per set, whatever their number


def test_gpu_evaluator_times_the_served_launches():
    """What the tuner times is what the runtime launches: the verify without its factors,
    the replay commit with the tree size and depth promised."""
    from bole_cli import kernels
    from bole_cli.timing import depth_promise
    from bole_cli.tuning.gpu import GpuEvaluator

    calls = []

    def spy(name):
        def call(*args, **kw):
            calls.append((name, {k: kw.get(k) for k in ("factors", "max_nodes", "max_depth")}))
            return getattr(kernels, name)(*args, **kw)
        return call

    mod = SimpleNamespace(**{n: spy(n) for n in ("tree_verify_gated", "tree_verify", "tree_commit_replay_gated",
                                                 "tree_commit_replay")})
    ev = GpuEvaluator(device="cpu", act_dtype="float32", rotate=1, timer=FakeTimer(), device_name="cpu",
                      make_layer_inputs=cpu_layer_inputs, kernels_mod=mod)
    for kernel in ("tree_verify", "tree_commit_replay"):
        b = Bucket(kernel, (1, 2, 32, 32), 2, 8)
        ev.prepare(b)
        calls.clear()
        ev.time(b, ev.default_config(b), 10.0)
        want = ("tree_verify_gated", {"factors": False, "max_nodes": 8, "max_depth": depth_promise("random", 8)}) \
            if kernel == "tree_verify" else \
            ("tree_commit_replay_gated", {"factors": None, "max_nodes": 8, "max_depth": depth_promise("random", 8)})
        assert calls == [want]
        ev.release()


def test_check_rejects_a_verify_whose_served_form_is_wrong():
    """The verify is checked with its factors and as served without them (its own compiled
    kernel): a config wrong only in the served form is rejected."""
    import torch

    from bole_cli import kernels
    from bole_cli.tuning.checks import build_check_case, run_check

    case = build_check_case("tree_verify", {"H": 1, "HV": 2, "K": 16, "V": 16}, act_dtype=torch.float32,
                            sizes=(12, 5, 1, 7))

    def served_wrong(fn):
        def call(*args, factors=True, **kw):
            res = fn(*args, factors=factors, **kw)
            if not factors:
                res.o.mul_(1.01)
            return res
        return call

    cfg = {"BV": 16, "BK": 16, "VSPLIT": 1, "num_warps": 4}
    assert run_check("tree_verify", case, cfg).ok
    v = run_check("tree_verify", case, cfg, kernels_mod=SimpleNamespace(
        tree_verify_gated=served_wrong(kernels.tree_verify_gated), tree_verify=kernels.tree_verify))
    assert (v.ok, v.outcome) == (False, "rejected") and v.reason.startswith("o without the factors")
    v = run_check("tree_verify", case, cfg, kernels_mod=SimpleNamespace(
        tree_verify_gated=kernels.tree_verify_gated, tree_verify=served_wrong(kernels.tree_verify)))
    assert (v.ok, v.outcome) == (False, "rejected") and v.reason.startswith("o ungated without the factors")


# ---- the command ------------------------------------------------------------------------------

def test_dry_run_json():
    r = runner.invoke(cli.app, ["tune-kernels", "--dry-run", "--model", "4b,9b", "--kernels", "tree_commit,tree_conv",
                                "--sample", "2", "--json"])
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["dry_run"] and [s["kernel"] for s in data["spaces"]] == ["tree_commit", "tree_conv"]
    assert data["spaces"][0]["models"] == ["Qwen/Qwen3.5-4B", "Qwen/Qwen3.5-9B"]
    assert len(data["buckets"]) == 4 + 4 * 5 and data["estimate_s"] > 0  # conv: batch x nodes
    assert len(data["validated"]) == 4 and all(v["ok"] for v in data["validated"])
    assert data["validated"][0]["config"] == {"BV": 16, "num_warps": 4, "num_stages": 1}  # the default (batch 1) first


def test_dry_run_table_and_a_failing_candidate(monkeypatch):
    r = runner.invoke(cli.app, ["tune-kernels", "--dry-run", "--kernels", "tree_commit", "--sample", "1"],
                      env={"COLUMNS": "150"})
    assert r.exit_code == 0, r.stderr
    assert "search space per kernel and model shape" in r.stdout and "BV: 16/32/64/128" in r.stdout
    assert "dry run: 1 of 1 sampled candidates match the reference" in r.stdout
    import bole_cli.tuning.gpu as gpu

    monkeypatch.setattr(gpu, "run_check", lambda *a, **k: Verdict(False, "rejected", "o rel err 1.0e+00 > 0.002"))
    r = runner.invoke(cli.app, ["tune-kernels", "--dry-run", "--kernels", "tree_commit", "--sample", "1"])
    assert r.exit_code == 1 and "1 of 1 sampled candidates failed" in r.stderr


def test_without_a_gpu_timing_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    r = runner.invoke(cli.app, ["tune-kernels", "--kernels", "tree_commit"])
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [
        "error: bole tune-kernels times the kernels and needs a CUDA GPU (none found); `bole tune-kernels "
        "--dry-run` prints the search space and checks candidates on the CPU"]


@pytest.mark.parametrize("args,text", [
    (["--sampler", "random"], "--sampler: expected tpe or grid"),
    (["--kernels", "tree_verify,gdn"], "--kernels: unknown gdn"),
    (["--nodes", "16,300"], "--nodes: expected an integer from 1 to 256, got 300"),
    (["--batch", "0"], "--batch: expected an integer >= 1, got 0"),
    (["--trials", "0"], "--trials: expected an integer from 1 to 1,000, got 0"),
    (["--model", "nosuch"], "unknown model 'nosuch'"),
])
def test_bad_options_exit_2(args, text):
    r = runner.invoke(cli.app, ["tune-kernels", "--dry-run", *args])
    assert r.exit_code == 2 and text in r.stderr


def test_gpu_command_path_with_fakes(monkeypatch, tmp_path):
    """The whole non-dry-run command with a fake device: plan, study storage, progress,
    profile writes per bucket, JSON, and a resumed second run."""
    import torch

    import bole_cli.timing as timing
    import bole_cli.tuning.gpu as gpu

    made = []

    class Fake(FakeEvaluator):
        device_name, triton_version = H200, "3.9.0"

        def __init__(self, **kw):
            super().__init__()
            made.append(self)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: H200)
    monkeypatch.setattr(gpu, "GpuEvaluator", Fake)
    monkeypatch.setattr(timing, "warm_gpu", lambda torch: None)
    prof = tmp_path / "kernels.yaml"
    args = ["tune-kernels", "--kernels", "tree_commit", "--batch", "1,4", "--trials", "4", "--profile", str(prof)]
    r = runner.invoke(cli.app, args + ["--json"])
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["device"] == H200 and data["gpu"] == "h200" and len(data["results"]) == 2
    assert all(x["speedup"] >= 1.0 for x in data["results"])
    assert (tmp_path / "cache" / "bole" / "tune").is_dir()
    assert "tuning 2 buckets x 4 trials (tpe) on NVIDIA H200: about" in r.stderr
    entries, _ = tt.load_tuned_entries([prof], H200, data["triton"])
    assert sorted(e.bucket.key for e in entries) == ["tree_commit/H16-HV32-K128-V128/B1",
                                                     "tree_commit/H16-HV32-K128-V128/B4"]
    # a second run resumes the studies: nothing new to evaluate; the table is printed
    r = runner.invoke(cli.app, args + ["--report", str(tmp_path / "r.json")], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.stderr
    assert made[-1].checked == []
    assert "tuned launch configs on NVIDIA H200" in r.stdout and "2 buckets written to" in r.stdout
    assert [x["bucket"] for x in json.loads((tmp_path / "r.json").read_text())["results"]] == \
        [x["bucket"] for x in data["results"]]


# ---- on a GPU (skipped without CUDA) --------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("kernel,model", [("tree_verify", GDN_27B), ("tree_commit", GDN_27B),
                                          ("tree_commit_replay", GDN_27B), ("tree_conv", (10240, 4))])
def test_gpu_builtin_configs_pass_the_gate(kernel, model):
    from bole_cli.tuning.gpu import GpuEvaluator

    ev = GpuEvaluator()
    b = Bucket(kernel, model, 4, 16 if BY_NODES[kernel] else None)
    v = ev.check(b, ev.default_config(b))
    assert v.ok, v.reason


@pytest.mark.gpu
def test_gpu_small_tuning_run(tmp_path):
    # optuna is a dependency of the package, so it is everywhere `pip install` ran; the
    # lent GPU machine has torch but no network to install it (experiments/README.md H-1)
    pytest.importorskip("optuna", reason="optuna is not installed on this GPU machine")
    from bole_cli.tuning.gpu import GpuEvaluator
    from bole_cli.tuning.study import TuneSettings, import_optuna, open_storage, run_tuning

    optuna = import_optuna()
    storage = open_storage(optuna, tmp_path / "s.journal")[0]
    buckets = [Bucket("tree_verify", GDN_9B, 4, 16), Bucket("tree_commit_replay", GDN_9B, 4),
               Bucket("tree_conv", (8192, 4), 4, 16)]
    # short timings and one confirm round: the whole GPU suite fits one 5-minute device call
    # (this test took 42 s of 306 at trials=4 and the default timings, experiments/README.md S26-d)
    settings = TuneSettings(trials=3, quick_ms=5.0, full_ms=10.0, confirm_rounds=1)
    results = run_tuning(optuna, storage, buckets, GpuEvaluator(), settings)
    for r in results:
        assert not r.failed, r.failed
        assert 0 < r.us <= r.default_us and r.counts["timed"] >= 1


def test_kernel_sources_follow_the_kernels_imports():
    """A study's source fingerprint covers every kernels module the launch imports: the
    verify's parts, chain and level kernels and its launch configs (a hand list missed
    them), and the commit's configs."""
    from bole_cli.tuning.study import kernel_sources

    verify = kernel_sources("tree_verify")
    for name in ("tree_verify.py", "tree_verify_tile.py", "tree_verify_blocked.py", "tree_verify_parts.py",
                 "tree_verify_chain.py", "tree_verify_levels.py", "jit_math.py", "configs.py"):
        assert name in verify
    assert {"tree_commit.py", "configs.py"} <= set(kernel_sources("tree_commit"))
    assert "tree_conv.py" in kernel_sources("tree_conv") and "tree_verify.py" not in kernel_sources("tree_conv")


@pytest.mark.parametrize("dry", [["--dry-run"], []])
def test_sample_has_an_upper_bound_checked_before_any_work(monkeypatch, dry):
    """A huge --sample would check every candidate in the Triton interpreter for minutes:
    refused at once, naming --sample and its bound (given in --help), before any check."""
    import bole_cli.tuning.run as run_mod
    from bole_cli.commands.tune_kernels import MAX_DRY_RUN_SAMPLE

    monkeypatch.setattr(run_mod, "dry_run", lambda *a, **k: pytest.fail("ran past a bad --sample"))
    r = runner.invoke(cli.app, ["tune-kernels", *dry, "--sample", "100000"])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        f"error: --sample: expected an integer from 1 to {MAX_DRY_RUN_SAMPLE}, got 100,000"]
    r = runner.invoke(cli.app, ["tune-kernels", "--help"], env={"COLUMNS": "200"})
    assert f"at most {MAX_DRY_RUN_SAMPLE}" in r.stdout


def test_sample_at_its_bound_is_accepted(monkeypatch):
    import bole_cli.tuning.run as run_mod
    from bole_cli.commands.tune_kernels import MAX_DRY_RUN_SAMPLE

    seen = {}

    def fake(*a, sample, **k):
        seen["sample"] = sample
        raise InputError("stop here")

    monkeypatch.setattr(run_mod, "dry_run", fake)
    r = runner.invoke(cli.app, ["tune-kernels", "--dry-run", "--sample", str(MAX_DRY_RUN_SAMPLE)])
    assert r.exit_code == 2 and seen == {"sample": MAX_DRY_RUN_SAMPLE}
