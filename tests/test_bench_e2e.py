"""`bole bench e2e` (issue 8): the drafter's tree, the simulated acceptance model, the
batch budget, the largest-batch search, and the exactness check: on a tiny model on CPU
(float64, reference GDN ops) autoregressive, snapshot-tree and Bole decoding emit the same
greedy token stream. A CPU smoke run of the whole command, and its errors."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bole_cli import cli
from bole_cli.bench.e2e import simulated_acceptance as e2e_acc
from bole_cli.bench.e2e import decoders, harness
from bole_cli.bench.e2e import options as e2e_options
from bole_cli.bench.e2e import tree_budget as e2e_plan
from bole_cli.bench.drafter import MTPDrafter, build_layout
from bole_cli.calibrate import acceptance as acc_mod
from bole_cli.catalog.models import resolve_model
from bole_cli.errors import InputError
from bole_cli.runtime import tiny_spec
from bole_cli.trees import beam_tree

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

F64 = torch.float64
DEPTH, TOPK = 3, 2


# ---- the drafter's tree and the acceptance model ------------------------------------------

@pytest.mark.parametrize("depth,topk", [(8, 4), (3, 2), (5, 3), (1, 1)])
def test_layout_is_the_eagle_beam_tree(depth, topk):
    rows = acc_mod.preset_rows(0.9, depth, topk)
    lay = build_layout(depth, topk, rows)
    want = beam_tree(depth, topk, level_probs=rows)
    assert lay.tree.parents == want.parents and lay.tree.log_probs == want.log_probs
    assert lay.level_rows == (1,) + (topk,) * (depth - 1)
    for lvl, front in enumerate(lay.frontier):  # the expanded nodes are the next level's parents
        start, nxt = lay.level_start[lvl], lay.level_start[lvl + 1]
        parents = [lay.tree.parents[nxt + j * topk] for j in range(len(front))]
        assert parents == [start + f for f in front]
    for node, kids in enumerate(lay.children):
        assert [lay.node_rank[k] for k in kids] == list(range(len(kids)))
        assert all(lay.node_depth[k] == lay.node_depth[node] + 1 for k in kids)


@pytest.mark.parametrize("preset", sorted(acc_mod.PRESET_TARGETS))
def test_presets_reproduce_the_papers_mean_accepted_tokens(preset):
    acc = e2e_acc.load_e2e_acceptance(preset)
    assert not acc.greedy and "simulated" in acc.statement() and "measured" in acc.statement()
    assert e2e_acc.paper_shape_expected(acc) == pytest.approx(acc_mod.PRESET_TARGETS[preset], abs=2e-3)


def test_simulated_walk_matches_the_model_and_is_seeded():
    acc = e2e_acc.load_e2e_acceptance("paper-mbpp")
    q = acc.rows(8, 4)
    lay = build_layout(8, 4, q)
    plan = e2e_plan.plan_trees(lay, 1, 128)
    assert plan.sizes == (lay.n_nodes,) and plan.expected == pytest.approx(6.70, abs=2e-3)
    kept = plan.local[0]
    n, total = 4000, 0
    for step in range(n):
        path = e2e_acc.walk_simulated(lay, q, kept, e2e_acc.step_rng(0, 0, step))
        assert all(lay.tree.parents[c] == p for p, c in zip([0] + path, path))  # a root path
        total += len(path) + 1
    mean = total / n
    assert abs(mean - 6.70) < 4 * 1.5 / math.sqrt(n)  # within 4 sigma (sd of the length < 1.5)
    # same (seed, request, step) -> same path; a smaller budget cuts paths at unkept nodes
    assert e2e_acc.walk_simulated(lay, q, kept, e2e_acc.step_rng(3, 1, 7)) == e2e_acc.walk_simulated(
        lay, q, kept, e2e_acc.step_rng(3, 1, 7))
    small = e2e_plan.plan_trees(lay, 4, 32)
    assert sum(small.sizes) == 32 and small.expected < plan.expected
    for b in range(4):
        for step in range(50):
            path = e2e_acc.walk_simulated(lay, q, small.local[b], e2e_acc.step_rng(0, b, step))
            assert all(i in small.local[b] for i in path)


def _host_walk(plan, b, greedy, target, tokens, seed, step):
    """(accepted local, committed tokens) by simulated_acceptance's host walks."""
    lay, kept, start = plan.layout, plan.local[b], plan.forest.cu_seqlens[b]
    if greedy:
        path = e2e_acc.walk_greedy(lay, kept, start, target, tokens)
    else:
        path = e2e_acc.walk_simulated(lay, plan.q, kept, e2e_acc.step_rng(seed, b, step))
    last = kept[path[-1]] if path else 0
    return last, [tokens[start + kept[i]] for i in path] + [target[start + last]]


@settings(max_examples=40, deadline=None)
@given(depth=st.integers(1, 6), topk=st.integers(1, 4), batch=st.integers(1, 4),
       share=st.floats(0.05, 1.0), vocab=st.integers(1, 4), greedy=st.booleans(), seed=st.integers(0, 10**6))
def test_device_walk_accepts_what_the_host_walk_accepts(depth, topk, batch, share, vocab, greedy, seed):
    """The sample phase on the device (device_walk.py) against the host walks, step by step:
    pruned trees (a budget that cuts nodes), token collisions among siblings (a vocabulary of
    1-4: the first kept match by rank wins), several steps of simulated draws; and its two
    forms, the torch walk and kernels.tree_accept (interpreted here), equal in every output,
    the columns past the path included."""
    from bole_cli.bench.e2e.device_walk import DeviceWalk, simulated_ranks

    q = e2e_acc.load_e2e_acceptance("paper-mbpp").rows(depth, topk)
    lay = build_layout(depth, topk, q)
    budget = max(batch, round(share * batch * lay.n_nodes))
    plan = e2e_plan.plan_trees(lay, batch, budget, q=q)
    steps = 3
    ranks = None if greedy else simulated_ranks(q, topk, depth, seed, batch, steps)
    walk = DeviceWalk(plan, torch.device("cpu"), greedy=greedy, ranks=ranks)
    gen = torch.Generator().manual_seed(seed)
    n = plan.forest.n_nodes
    for step in range(steps):
        target = torch.randint(vocab, (n,), generator=gen)
        tokens = torch.randint(vocab, (n,), generator=gen)
        accepted, out = walk.sample(target, tokens)
        acc_k, out_k = walk.sample(target, tokens, kernel=True)
        assert torch.equal(acc_k, accepted) and torch.equal(out_k, out), step
        for b in range(batch):
            last, toks = _host_walk(plan, b, greedy, target.tolist(), tokens.tolist(), seed, step)
            assert int(accepted[b]) == last, (step, b)
            count = int(out[b, 0])
            assert out[b, 1:count + 1].tolist() == toks, (step, b)
        walk.advance()


def test_device_walk_reaches_deep_paths():
    """The walk can fail: an all-accepting draw (rank 0 at every level) and matching tokens
    must walk the whole rank-0 chain, so a walk that stopped early would be caught."""
    from bole_cli.bench.e2e.device_walk import DeviceWalk

    q = e2e_acc.load_e2e_acceptance("paper-mbpp").rows(4, 2)
    lay = build_layout(4, 2, q)
    plan = e2e_plan.plan_trees(lay, 2, 2 * lay.n_nodes, q=q)
    sim = DeviceWalk(plan, torch.device("cpu"), greedy=False, ranks=[[[0] * 4, [0, 0, -1, 0]]])
    n = plan.forest.n_nodes
    target, tokens = torch.arange(n), torch.arange(n) + 1000
    accepted, out = sim.sample(target, tokens)
    assert out[:, 0].tolist() == [5, 3]  # four drafts + the bonus; two drafts + the bonus
    chain = lay.tree.best_path()
    assert int(accepted[0]) == plan.local[0][chain[4]] and int(accepted[1]) == plan.local[1][chain[2]]


def test_acceptance_inputs(tmp_path):
    f = tmp_path / "acc.json"
    f.write_text(json.dumps({"name": "mine", "per_depth": [0.8, 0.7, 0.6]}))
    acc = e2e_acc.load_e2e_acceptance(str(f))
    assert acc.name == "mine" and len(acc.rows(3, 2)) == 3
    with pytest.raises(InputError, match="depth"):
        acc.rows(4, 2)
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"curve": {"n": [1, 8], "e_acc": [1, 3]}}))
    with pytest.raises(InputError, match="per-depth"):
        e2e_acc.load_e2e_acceptance(str(curve))
    with pytest.raises(InputError, match="neither a preset"):
        e2e_acc.load_e2e_acceptance("paper-nothing")
    assert e2e_acc.load_e2e_acceptance("greedy").greedy


def test_budget_resolution():
    spec = resolve_model("9b")
    from bole_cli.profiles import find_profile, load_profile, lookup_budget

    path = find_profile("h200", spec)
    assert path is not None, "the shipped H200 profile of Qwen3.5-9B"
    entry = lookup_budget(load_profile(path), 16, 4096)[0]
    want = entry.get("n_star") or entry["b_ver"]  # the decision's best tree, B_ver without one
    n, src = e2e_plan.resolve_budget("profile", spec, "NVIDIA H200", 16, 4096, 117)
    assert n == max(16, min(want, 16 * 117)) and "profile" in src and "Qwen3.5-9B" in src
    # a batch outside the profile keeps its nearest bucket's tokens per request (as serve does)
    n64, src = e2e_plan.resolve_budget("profile", spec, "NVIDIA H200", 64, 4096, 117)
    assert n64 == min(want * 4, 64 * 117) and f"is {want * 4} over 64" in src
    n, src = e2e_plan.resolve_budget("profile", spec, "cpu", 4, 4096, 117)
    assert n == 128 and "no profile" in src
    assert e2e_plan.resolve_budget(300, spec, "cpu", 2, 4096, 117) == (234, "--budget 300; 234 kept (every drafted node)")
    with pytest.raises(InputError, match="smaller than batch"):
        e2e_plan.resolve_budget(8, spec, "cpu", 16, 4096, 117)
    assert e2e_options.parse_budget("Profile") == "profile" and e2e_options.parse_budget("96") == 96
    for bad in ("x", "0", "-3"):
        with pytest.raises(InputError, match="--budget"):
            e2e_options.parse_budget(bad)


@pytest.mark.parametrize("limit,cap,probes", [(5, 256, 8), (1, 256, 8), (0, 256, 8), (300, 256, 8),
                                              (200, 256, 8), (37, 256, 3)])
def test_max_batch_search(limit, cap, probes):
    calls = []

    def fits(b):
        calls.append(b)
        return (b <= limit, "" if b <= limit else "out of memory")

    got = harness.search_max_batch(fits, cap, probes)
    assert len(calls) <= probes and calls[0] == cap
    if limit >= cap:
        assert got["capped"] and got["max_batch"] == cap
    elif got["exact"]:
        assert got["max_batch"] == limit and got["fails_at"] == limit + 1
    else:  # out of probes: a bracket that holds the answer
        assert got["max_batch"] <= limit < got["fails_at"]
    if probes == 8 and limit <= 16:
        assert got["exact"], got  # small answers (the snapshot decoder's) are settled exactly
    if probes == 8 and limit < cap:
        assert got["fails_at"] - got["max_batch"] <= 8
    err = harness.search_max_batch(lambda b: (False, "RuntimeError: boom"), 64, 8)
    assert err["error"] == "RuntimeError: boom" and err["max_batch"] is None


# ---- the exactness check -------------------------------------------------------------------

@pytest.fixture(scope="module")
def bench():
    return harness.E2EBench(tiny_spec(), device="cpu", dtype=F64, context=6, depth=DEPTH, topk=TOPK,
                        acceptance="greedy", budget=14, seed=0, gdn_backend="reference", warmup=1, steps=2)


def oracle(seed: int):
    """A drafter that knows the target's greedy continuation but errs: along the top-1 path
    it drafts the true tokens up to a random depth, then a wrong one."""
    rng = random.Random(seed)

    def override(dec, toks):
        lay = dec.plan.layout
        best = lay.tree.best_path()  # root, then the rank-0 chain
        for b in range(dec.batch):
            sim = dec.cache.clone()
            truth, t = [], dec.pending[b]
            for _ in range(lay.depth):
                t = int(dec.model.decode(sim, [t], [b])[0].argmax())
                truth.append(t)
            cut = rng.randint(0, lay.depth)
            for d in range(1, lay.depth + 1):
                toks[b, best[d]] = truth[d - 1] if d <= cut else (truth[d - 1] + 1) % dec.model.spec.vocab
        return toks

    return override


def streams(bench, name, batch, steps, override=None):
    with torch.inference_mode():
        dec = bench.decoder(name, batch, steps, override=override)
        for _ in range(steps):
            dec.step()
    return dec.streams, dec.accepted


@pytest.mark.parametrize("use_oracle", [True, False], ids=["oracle-drafter", "mtp-drafter"])
def test_three_decoders_emit_the_same_greedy_stream(bench, use_oracle):
    batch, steps = 2, 5
    bole, acc_b = streams(bench, "bole", batch, steps, oracle(1) if use_oracle else None)
    snap, acc_s = streams(bench, "snapshot", batch, steps, oracle(1) if use_oracle else None)
    assert bole == snap and acc_b == acc_s
    longest = max(map(len, bole))
    ar, acc_ar = streams(bench, "ar", batch, longest)
    assert all(a == [1] * batch for a in acc_ar)
    for b in range(batch):
        assert len(bole[b]) == sum(a[b] for a in acc_b)
        assert bole[b] == ar[b][: len(bole[b])], f"request {b}"
    mean = sum(map(sum, acc_b)) / (batch * steps)
    if use_oracle:  # the oracle's drafts are accepted: deep paths were verified and committed
        assert mean > 1.5 and max(max(a) for a in acc_b) >= 3
    else:
        assert mean >= 1.0


def test_a_wrong_commit_breaks_the_stream(bench):
    """The check can fail: committing one node too many diverges from autoregressive decoding."""
    with torch.inference_mode():
        dec = bench.decoder("bole", 2, 4, override=oracle(2))
        real_commit = dec.model.commit_device
        try:
            def commit_device(cache, out, accepted):
                deeper = []
                for b, a in enumerate(accepted.tolist()):
                    lo, hi = out.batch.cu_seqlens[b].item(), out.batch.cu_seqlens[b + 1].item()
                    kids = [j for j in range(hi - lo) if out.batch.parents[lo + j].item() == a]
                    deeper.append(kids[0] if kids else a)
                real_commit(cache, out, torch.tensor(deeper, dtype=torch.int64))

            dec.model.commit_device = commit_device
            for _ in range(4):
                dec.step()
        finally:
            del dec.model.commit_device
    ar, _ = streams(bench, "ar", 2, max(map(len, dec.streams)))
    assert any(dec.streams[b] != ar[b][: len(dec.streams[b])] for b in range(2))


def test_simulated_acceptance_is_shared_and_memory_is_reported():
    bench = harness.E2EBench(tiny_spec(layers=4), device="cpu", dtype=torch.float32, context=8, depth=DEPTH,
                         topk=TOPK, acceptance="paper-mbpp", budget="profile", seed=3, warmup=1, steps=3)
    runs = {name: bench.run(name, 2) for name in decoders.DECODERS}
    assert runs["snapshot"].accept_trace == runs["bole"].accept_trace
    assert runs["ar"].mean_accepted == 1.0 and runs["ar"].tokens == 2 * 3
    for name in ("snapshot", "bole"):
        r = runs[name]
        assert r.tokens == sum(map(sum, r.accept_trace[1:4])) and r.mean_accepted >= 1.0
        assert r.budget == 2 * bench.layout.n_nodes and r.expected_accepted > 1.0
        assert set(r.phase_ms) == set(decoders.PHASES) and r.step_ms > 0 and not r.error
    s = bench.model.spec
    snap_node = s.gdn_value_heads * s.gdn_value_dim * s.gdn_key_dim * 4
    t = bench.layout.n_nodes  # every node kept: the snapshot buffer is [L, B, T+1, HV, V, K]
    assert runs["snapshot"].verify_state_bytes == bench.model.n_gdn * 2 * (t + 1) * snap_node
    assert runs["bole"].verify_state_bytes < runs["snapshot"].verify_state_bytes / 4


def test_drafter_shapes_and_weights():
    spec = tiny_spec()
    from bole_cli.runtime import HybridModel

    model = HybridModel(spec, "cpu", torch.float32, seed=0)
    lay = build_layout(DEPTH, TOPK, acc_mod.preset_rows(0.9, DEPTH, TOPK))
    head = MTPDrafter(model, lay)
    assert head.param_bytes == MTPDrafter.param_bytes_for(spec, torch.float32)
    st = head.new_state(3, 10)
    st.pending.copy_(torch.tensor([5, 6, 7]))
    with torch.inference_mode():
        toks = head.forward(st)
        again = head.forward(st)
    assert toks.shape == (3, lay.n_nodes) and toks[:, 0].tolist() == [5, 6, 7]
    assert torch.equal(toks, again) and int(toks.max()) < spec.vocab
    # a node's k children are k different tokens (top-k of one distribution)
    for node, kids in enumerate(lay.children):
        if kids:
            assert len(set(toks[0, list(kids)].tolist())) == len(kids)


@pytest.mark.parametrize("switch,context", [
    ("cache_kernel", 300),  # kernels.cache_attention, past one key split (MIN_SPLIT_KEYS), against SDPA
    ("skinny_mm", 12),  # the norms, residual adds and SwiGLU fused into the skinny GEMM, against unfused
    ("attention_in_kernel", 12),  # q/k norms, RoPE and the KV write in one launch, against the pieces
])
def test_drafter_through_the_targets_kernel_paths_agrees(switch, context, monkeypatch):
    """The head on the target's kernel paths (the same model switch) gives the plain path's
    hidden states and drafts, levels of 1 and several rows; the kernel ran when on."""
    import importlib

    import bole_cli.bench.drafter as drafter_mod
    from bole_cli.runtime import HybridModel

    # the modules (the package's names are the functions)
    attention_in_mod = importlib.import_module("bole_cli.kernels.attention_in")
    skinny_mod = importlib.import_module("bole_cli.kernels.skinny_mm")

    calls = []
    for mod, name in ((drafter_mod, "cache_attention"), (attention_in_mod, "attention_in"), (skinny_mod, "skinny_mm")):
        kernel = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _k=kernel, _n=name, **kw: calls.append(_n) or _k(*a, **kw))
    model = HybridModel(tiny_spec(), "cpu", torch.float32, seed=0)
    head = MTPDrafter(model, build_layout(DEPTH, TOPK, acc_mod.preset_rows(0.9, DEPTH, TOPK)))
    runs = {}
    for on in (False, True):
        calls.clear()
        setattr(model, switch, on)
        st = head.new_state(2, context)
        st.pending.copy_(torch.tensor([3, 4]))
        with torch.inference_mode():
            x1, top1 = head.level(st, 0, st.pending.view(2, 1), st.hidden.view(2, 1, -1), 0)
            x2, top2 = head.level(st, 1, top1[:, :, 0].repeat(1, 3), x1.repeat(1, 3, 1), 1)
        runs[on] = (x1, top1, x2, top2)
        kernel = {"cache_kernel": "cache_attention", "skinny_mm": "skinny_mm"}.get(switch, "attention_in")
        assert (kernel in calls) == on
    for a, b in zip(runs[False], runs[True]):
        if a.dtype.is_floating_point:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(a, b)


# ---- the command ---------------------------------------------------------------------------

def test_cli_smoke_run_on_cpu(tmp_path):
    r = runner.invoke(cli.app, ["bench", "e2e", "--device", "cpu", "--tiny", "--batch", "1,2", "--context", "8",
                                "--steps", "2", "--warmup", "1", "--depth", "3", "--topk", "2",
                                "--out-dir", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert "simulated" in data["statement"] and "measured" in data["statement"]
    assert [(x["decoder"], x["batch"]) for x in data["results"]] == [
        (d, b) for b in (1, 2) for d in ("ar", "snapshot", "bole")]
    assert data["same_acceptance_snapshot_vs_bole"] == {"1": True, "2": True}
    assert data["snapshot_engine"]["engine"] == "torch"
    assert all(x["tok_s"] > 0 and x["error"] == "" for x in data["results"])
    assert all(v["max_batch"] is None for v in data["max_batch"].values())
    assert (tmp_path / "e2e-cpu-tiny.json").is_file() and (tmp_path / "e2e-cpu-tiny.png").stat().st_size > 0


@pytest.mark.parametrize("runs", [3, 0], ids=["some-runs", "before-the-first"])
def test_interrupted_e2e_writes_what_it_measured(runs, tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM during `bole bench e2e`: the runs measured before it are written
    (marked interrupted; no picture of none) and the command ends with 130."""
    real_run, done = harness.E2EBench.run, []

    def run(self, name, batch):
        if len(done) == runs:
            raise KeyboardInterrupt
        done.append(name)
        return real_run(self, name, batch)

    monkeypatch.setattr(harness.E2EBench, "run", run)
    (tmp_path / "cut.json").write_text("complete")
    r = runner.invoke(cli.app, ["bench", "e2e", "--device", "cpu", "--tiny", "--batch", "1,2", "--context", "8",
                                "--steps", "2", "--warmup", "1", "--depth", "3", "--topk", "2",
                                "--out-dir", str(tmp_path), "--tag", "cut"])
    assert r.exit_code == 130, r.output
    data = json.loads((tmp_path / "cut-partial.json").read_text())
    assert data["interrupted"] is True and len(data["results"]) == runs
    assert [x["decoder"] for x in data["results"]] == ["ar", "snapshot", "bole"][:runs]
    assert (tmp_path / "cut-partial.png").exists() == (runs > 0)
    assert f"the {runs} run(s) measured before it are in {tmp_path / 'cut-partial.json'}" in " ".join(r.stderr.split())
    assert ("cut-partial.png" in r.output) == (runs > 0)
    assert (tmp_path / "cut.json").read_text() == "complete", "an earlier complete run's results are kept"


def test_e2e_where_no_run_was_measured_fails_and_draws_nothing(tmp_path, monkeypatch):
    """Every decoder failing (not for memory) is a failed command: exit 1 naming the first
    error and the JSON that keeps them all (STEM-failed: an earlier complete run's results and
    picture are kept); no picture of it, and none announced (an older one of the stem is not
    this run's)."""
    def decoder(self, name, batch, n):
        raise RuntimeError(f"broken {name}")

    monkeypatch.setattr(harness.E2EBench, "decoder", decoder)
    (tmp_path / "gone.png").write_bytes(b"an older run's picture")
    (tmp_path / "gone-failed.png").write_bytes(b"an older failed run's picture")
    r = runner.invoke(cli.app, ["bench", "e2e", "--device", "cpu", "--tiny", "--batch", "1", "--context", "8",
                                "--steps", "2", "--warmup", "1", "--depth", "3", "--topk", "2",
                                "--out-dir", str(tmp_path), "--tag", "gone"])
    assert r.exit_code == 1, r.output
    assert "no run was measured: 3 failed (first: RuntimeError: broken ar)" in r.stderr
    data = json.loads((tmp_path / "gone-failed.json").read_text())
    assert [x["error"] for x in data["results"]] == [f"RuntimeError: broken {d}" for d in ("ar", "snapshot", "bole")]
    assert (tmp_path / "gone-failed.png").read_bytes() == b"an older failed run's picture"
    assert ".png" not in r.output
    assert (tmp_path / "gone.png").read_bytes() == b"an older run's picture"


def test_check_options_returns_the_checked_run_config():
    """The command checks once: check_options fills the defaults (--tiny's under --tiny) and
    returns the frozen E2EConfig run_e2e takes."""
    import dataclasses

    opts = dict(model="9b", batch=None, context=None, depth=None, topk=None, steps=None, warmup=None,
                decoders=None, chain_depths=None, budget="96", acceptance="paper-mbpp", tree_budgets=None,
                tree_shapes="4x2", draft_vocab=None, snapshot_engine="auto", max_batch=256, max_probes=8,
                probe_nodes=None, search=False, dtype="auto", device="cpu", graphs=False, seed=0)
    cfg = e2e_options.check_options(tiny=True, **opts)
    smoke = e2e_options.SMOKE_DEFAULTS
    assert cfg.spec == tiny_spec() and cfg.batches == (1, 2) and cfg.context == smoke["context"]
    assert cfg.decoders == tuple(smoke["decoders"].split(",")) and cfg.chain_depths == (2,)
    assert cfg.budget == 96 and cfg.tree_shapes == ((4, 2),) and cfg.dtype == "float32"
    assert cfg.use_graphs is False and cfg.search is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.steps = 3  # type: ignore[misc]
    for bad, flag in ((dict(decoders="ar,chains"), "--decoders"), (dict(snapshot_engine="x"), "--snapshot-engine"),
                      (dict(draft_vocab=129), "--draft-vocab"), (dict(budget="lots"), "--budget")):
        with pytest.raises(InputError, match=flag):
            e2e_options.check_options(tiny=True, **{**opts, **bad})
    with pytest.raises(InputError, match="unknown model"):
        e2e_options.check_options(tiny=False, **{**opts, "model": "nope", "device": "cuda"})


def test_help_notes_the_defaults_it_runs_with():
    """Every [full; --tiny] note of `bench e2e --help` is written from options' defaults, and shown
    (the --decoders note once read as Rich markup and vanished)."""
    import re

    r = runner.invoke(cli.app, ["bench", "e2e", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    text = " ".join(re.sub("[│╭╮╰╯─]", " ", r.stdout).split())
    full, smoke = e2e_options.E2E_DEFAULTS, e2e_options.SMOKE_DEFAULTS
    for name in ("batch", "context", "depth", "topk", "steps", "warmup", "decoders"):
        assert f"[{full[name]}; --tiny: {smoke[name]}]" in text, name
    assert f"[1..--depth; --tiny: {smoke['chain_depths']}]" in text
    assert all(name in text for name in e2e_options.DECODER_NAMES)


def _cuda() -> bool:
    return torch.cuda.is_available()


@pytest.mark.parametrize("argv,code,text", [
    (["--device", "cpu"], 2, "--device cpu runs only with --tiny"),
    (["--device", "cpu", "--tiny", "--budget", "lots"], 2, "--budget"),
    (["--device", "cpu", "--tiny", "--batch", "0"], 2, "--batch"),
    (["--device", "tpu"], 2, "--device"),
])
def test_cli_input_errors(argv, code, text):
    r = runner.invoke(cli.app, ["bench", "e2e", *argv])
    assert r.exit_code == code and text in r.stderr


def test_cli_without_cuda_says_so():
    if _cuda():
        pytest.skip("CUDA present")
    r = runner.invoke(cli.app, ["bench", "e2e", "--model", "9b"])
    assert r.exit_code == 1 and "needs a CUDA GPU" in r.stderr and "--device cpu --tiny" in r.stderr


@pytest.mark.gpu_slow
def test_three_decoders_greedy_on_cuda_with_graphs():
    """The same exactness check through the Triton kernels and CUDA graphs (float32)."""
    bench = harness.E2EBench(tiny_spec(), device="cuda", dtype=torch.float32, context=6, depth=DEPTH, topk=TOPK,
                         acceptance="greedy", budget=14, seed=0, warmup=1, steps=2)
    assert bench.use_graphs
    bole, acc_b = streams(bench, "bole", 2, 5, oracle(1))
    snap, acc_s = streams(bench, "snapshot", 2, 5, oracle(1))
    ar, _ = streams(bench, "ar", 2, max(map(len, bole)))
    assert bole == snap and acc_b == acc_s
    for b in range(2):
        assert bole[b] == ar[b][: len(bole[b])]


def test_e2e_tables_fit_an_80_column_terminal():
    """Narrow terminals get two tables (throughput; per-step costs and memory) that fit
    without truncated cells; wide ones get a single table."""
    import json
    from pathlib import Path

    from rich.console import Console

    from bole_cli.bench.e2e.report import tables

    data = json.loads((Path(__file__).parent.parent / "experiments/results/e2e-h200-qwen3.5-9b.json").read_text())
    console = Console(width=80, record=True)
    narrow = tables(data, 80)
    for t in narrow:
        console.print(t)
    text = console.export_text()
    assert len(narrow) == 2 and "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    bole16 = next(r for r in data["results"] if r["decoder"] == "bole" and r["batch"] == 16)
    assert f"{bole16['tok_s']:.0f}" in text and "30.2 MiB" in text  # a cell from the file, whole
    assert len(tables(data, 200)) == 1


def test_kernel_bench_tables_fit_an_80_column_terminal():
    from pathlib import Path
    from types import SimpleNamespace

    from rich.console import Console

    from bole_cli.bench.kernel_bench import KernelCase
    from bole_cli.bench.kernel_report import tables

    data = json.loads((Path(__file__).parent.parent / "experiments/results/kernels-h200-qwen3.5-9b.json").read_text())
    fields = set(KernelCase.__dataclass_fields__)
    cases = [KernelCase(**{k: v for k, v in c.items() if k in fields}) for c in data["cases"]]
    result = SimpleNamespace(model=data["model"], device=data["device"],
                             copy_bandwidth=data["copy_bandwidth_tb_s"] * 1e12, cases=cases)
    console = Console(width=80, record=True)
    for t in tables(result, 80):
        console.print(t)
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    b16 = next(c for c in cases if (c.tree, c.batch, c.nodes) == ("random", 16, 64))
    assert f"{b16.sglang_us:.1f}" in text and "24.1 MiB" in text
    assert len(tables(result, 200)) == 1


def test_tree_shapes_do_not_leak_into_chains_or_the_kv_read():
    """--tree-shapes: a chain walks the chains' own matrix (--depth x --topk's rank-1 path),
    not the last tree shape's, and every run reads the same KV length whatever the order."""
    b = harness.E2EBench(tiny_spec(), device="cpu", dtype=F64, context=6, depth=DEPTH, topk=TOPK,
                         acceptance="paper-mbpp", budget=8, seed=0, gdn_backend="reference",
                         warmup=1, steps=2)
    base_q = b.q
    b.use_shape(1, 2)  # a one-level tree: its matrix has one depth
    chain = b.chain_plan(2, DEPTH)
    assert len(chain.q) == DEPTH and chain.q[0] == tuple(base_q[0])
    assert b.plan(2).q == tuple(tuple(r) for r in b.q) and len(b.plan(2).q) == 1
    lengths = []
    for order in ((DEPTH, TOPK), (1, 2)):
        b.use_shape(*order)
        lengths.append(b.max_len(10))
    assert lengths[0] == lengths[1], lengths


def test_a_config_built_without_check_options_still_refuses_a_bad_snapshot_engine():
    from bole_cli.errors import InputError

    with pytest.raises(InputError, match="--snapshot-engine: expected one of"):
        harness.resolve_snapshot_engine("sglng", torch.device("cpu"))
