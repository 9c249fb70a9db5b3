"""The device-side refill of a step's metadata (bole_cli/runtime/tree_metadata.py): a batch
prepared for one forest and refilled with another equals the batch prepared for the other,
field by field, in every attention mode; the refill reads nothing back to the host; the
host-side TreeInputs refuses what the bucket cannot hold. The oracle is prepare_tree /
prepare_decode as they were before the refill (a host walk), kept below verbatim."""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from bole_cli.errors import InputError
from bole_cli.runtime import tree_metadata
from bole_cli.runtime.batch import Rope, forest_arrays, prepare_decode, prepare_tree
from bole_cli.runtime.tree_metadata import DecodeInputs, TreeInputs, refill_decode, refill_tree
from bole_cli.trees import chain_tree, pack_forest, random_tree

ROPE = Rope(8)
MAX_LEN = 60  # not a multiple of 16: the masks' rows carry padding
N_SLOTS = 6
MODES = ("dense", "split", "varlen")


# ---- the oracle: the host-walk preparation before tree_metadata ------------------------

def _legacy_additive(visible, dtype):
    width = visible.shape[-1]
    padded = -(-width // 16) * 16
    bias = torch.full(tuple(visible.shape[:-1]) + (padded,), float("-inf"), dtype=dtype, device=visible.device)
    return bias[..., :width].masked_fill_(visible, 0.0)


def legacy_prepare_decode(tokens, slots, kv_lens, *, rope, dtype, kv_bucket=1, varlen=False):
    bsz, lens = len(slots), [int(kv_lens[s]) for s in slots]
    need = max(lens) + 1
    limit = min(MAX_LEN, -(-need // kv_bucket) * kv_bucket)
    pos = torch.tensor(lens, dtype=torch.int64)
    cos, sin = rope.tables(pos)
    bias = used = None
    if any(n + 1 != limit for n in lens):
        if varlen and all(a < b for a, b in zip(slots, slots[1:])):
            used = torch.tensor([n + 1 for n in lens], dtype=torch.int32)
        else:
            vis = torch.arange(limit)[None, :] <= pos[:, None]
            bias = _legacy_additive(vis.view(bsz, 1, 1, limit), dtype)
    return dict(kv_limit=limit, tokens=torch.as_tensor(tokens, dtype=torch.int64), positions=pos, cos=cos,
                sin=sin, attn_bias=bias, kv_used=used)


def legacy_prepare_tree(forest, tokens, slots, kv_lens, *, rope, dtype, gqa_group, n_gdn_layers,
                        kv_bucket=1, split=False, varlen=False, bias_dtype=None):
    parents, cu = forest_arrays(forest)
    bsz, n = len(cu) - 1, len(parents)
    tok = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
    lens = [int(kv_lens[s]) for s in slots]
    sizes = [cu[b + 1] - cu[b] for b in range(bsz)]
    t_max = max(max(sizes), 1)
    depth, paths, node_b, local = [0] * n, [[] for _ in range(n)], [0] * n, [0] * n
    for b in range(bsz):
        for i in range(sizes[b]):
            g_i, p = cu[b] + i, parents[cu[b] + i]
            node_b[g_i], local[g_i] = b, i
            if p < 0:
                paths[g_i] = [i]
            else:
                depth[g_i] = depth[cu[b] + p] + 1
                paths[g_i] = paths[cu[b] + p] + [i]
    d_max = max((d + 1 for d in depth), default=1)
    need = max(lens[b] + sizes[b] for b in range(bsz))
    limit = min(MAX_LEN, -(-need // kv_bucket) * kv_bucket)
    base, nb, loc, dep = (torch.tensor(x, dtype=torch.int64) for x in (lens, node_b, local, depth))
    positions = base[nb] + dep
    cos, sin = rope.tables(positions)
    table = torch.tensor([p + [-1] * (d_max - len(p)) for p in paths], dtype=torch.int64).view(n, d_max)
    row = nb * t_max + loc
    anc = torch.zeros(bsz * t_max * t_max, dtype=torch.bool)
    hit = table >= 0
    anc[(row[:, None] * t_max + table.clamp(min=0))[hit]] = True
    anc = anc.view(bsz, t_max, t_max)
    par_pad = torch.full((bsz * t_max,), -1, dtype=torch.int64)
    par_pad[row] = torch.tensor(parents, dtype=torch.int64)
    par_pad = par_pad.view(bsz, t_max)
    pad_row = torch.arange(t_max)[None, :] >= torch.tensor(sizes)[:, None]

    def fold(vis):
        keys = vis.shape[-1]
        return vis[:, None, :, None, :].expand(bsz, 1, t_max, gqa_group, keys).reshape(bsz, 1, t_max * gqa_group, keys)

    split_base = lens[0] if split and all(x == lens[0] for x in lens) else None
    varlen = split_base is None and varlen and all(a < b for a, b in zip(slots, slots[1:])) and min(lens) > 0
    attn_bias = tree_bias = kv_used = None
    if varlen:
        kv_used = torch.tensor(lens, dtype=torch.int32)
    if split_base is None and not varlen:
        pos = torch.arange(limit)
        rel = pos[None, :] - base[:, None]
        in_tree = (rel >= 0) & (rel < t_max)
        tree_vis = torch.gather(anc, 2, rel.clamp(0, t_max - 1)[:, None, :].expand(bsz, t_max, limit))
        vis = (pos[None, None, :] < base[:, None, None]) | (tree_vis & in_tree[:, None, :])
        vis[..., 0] |= pad_row
        attn_bias = _legacy_additive(fold(vis), dtype)
    else:
        anc |= torch.diag_embed(pad_row)
        tree_bias = _legacy_additive(fold(anc), bias_dtype or dtype)
    rows = torch.arange(bsz, dtype=torch.int64)[:, None] * (t_max + 1) + par_pad + 1
    par_t = torch.tensor(parents, dtype=torch.int32)
    slots_t = torch.tensor(slots, dtype=torch.int64)
    return dict(max_depth=d_max, kv_limit=limit, split_base=split_base, tokens=tok, parents=par_t,
                depths=dep, positions=positions, cos=cos, sin=sin, node_slot=slots_t[nb], kv_pos=base[nb] + loc,
                pad_index=nb * t_max + loc, attn_bias=attn_bias, tree_bias=tree_bias, kv_used=kv_used, base=base,
                path_table=table, parent_rows=rows.t().contiguous(), sglang_parents=par_pad.clamp(min=0),
                layer_parents=par_t.repeat(n_gdn_layers), host_depths=depth)


# ---- comparing batches ----------------------------------------------------------------

def assert_same(got, want: dict) -> None:
    """Every field of `want` equal in `got` (exactly; biases with their 16-element padding)."""
    for name, w in want.items():
        g = getattr(got, name)
        if not isinstance(w, torch.Tensor):
            assert g == w, name
            continue
        assert isinstance(g, torch.Tensor), name
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert torch.equal(g, w), name
        if name in ("attn_bias", "tree_bias"):
            assert torch.equal(g._base, w._base), f"{name}'s padding"


def as_dict(batch) -> dict:
    return {**{f: getattr(batch, f) for f in ("kv_limit", "split_base") if hasattr(batch, f)},
            **{k: v for k, v in batch.tensors().items()}}


# ---- drawing forests --------------------------------------------------------------------

def draw_sizes(data, bsz: int) -> list[int]:
    """Request sizes, some empty, at least one node in all (a batch of nothing reads no key)."""
    sizes = data.draw(st.lists(st.integers(0, 7), min_size=bsz, max_size=bsz))
    return sizes if sum(sizes) else [1] + sizes[1:]


def make_forest(rng: random.Random, sizes, max_depth=None):
    """Packed (parents, cu) with a random shape per request (chains, wide, several roots,
    one node, empty requests); max_depth bounds it to a bucket."""
    trees = []
    for s in sizes:
        if s == 0:
            trees.append([])
        elif rng.random() < 0.25:  # as deep as the bucket allows
            d = s if max_depth is None else min(s, max_depth)
            trees.append(list(chain_tree(d).parents) + [rng.randrange(-1, d) for _ in range(s - d)])
        else:
            trees.append(list(random_tree(rng.randrange(10 ** 6), s, max_depth, None, shape="any").parents))
    cu = [0]
    for t in trees:
        cu.append(cu[-1] + len(t))
    return [p for t in trees for p in t], cu


def fix_depth(parents, cu, max_depth):
    """Cut a forest to max_depth by re-rooting too-deep nodes (keeps it valid)."""
    out = list(parents)
    for b in range(len(cu) - 1):
        depth = {}
        for i in range(cu[b + 1] - cu[b]):
            p = out[cu[b] + i]
            if p >= 0 and depth[p] + 1 >= max_depth:
                out[cu[b] + i] = p = -1
            depth[i] = 0 if p < 0 else depth[p] + 1
    return out


def draw_step(data, mode: str):
    """(F1, F2) of equal sizes and slots, with each its tokens and committed lengths, in
    the bucket of `mode`."""
    rng = random.Random(data.draw(st.integers(0, 2 ** 32 - 1)))
    bsz = data.draw(st.sampled_from([1, 2, 4]))
    sizes = draw_sizes(data, bsz)
    slots = rng.sample(range(N_SLOTS), bsz)
    if mode == "varlen":
        slots.sort()
    steps = []
    split_len = rng.randrange(0, 20)
    for k in range(2):
        if k == 0:
            parents, cu = make_forest(rng, sizes)
        else:
            d1 = max((d + 1 for d in legacy_depths(steps[0][0], cu)), default=1)
            parents, cu = make_forest(rng, sizes, d1)
            parents = fix_depth(parents, cu, d1)
        lens = [0] * N_SLOTS
        for s in slots:
            lens[s] = split_len if mode == "split" else rng.randrange(1 if mode == "varlen" else 0, 20)
        tokens = [rng.randrange(1000) for _ in parents]
        steps.append((parents, tokens, lens))
    return dict(cu=cu, slots=slots, steps=steps, gqa_group=data.draw(st.sampled_from([1, 4])),
                n_gdn_layers=data.draw(st.sampled_from([0, 2])),
                bias_dtype=data.draw(st.sampled_from([None, torch.float32, torch.float64])))


def legacy_depths(parents, cu):
    depth = [0] * len(parents)
    for b in range(len(cu) - 1):
        for i in range(cu[b + 1] - cu[b]):
            p = parents[cu[b] + i]
            depth[cu[b] + i] = 0 if p < 0 else depth[cu[b] + p] + 1
    return depth


def tree_kwargs(mode, case):
    return dict(rope=ROPE, dtype=torch.bfloat16, gqa_group=case["gqa_group"], n_gdn_layers=case["n_gdn_layers"],
                kv_bucket=MAX_LEN, split=mode == "split", varlen=mode == "varlen", bias_dtype=case["bias_dtype"])


def prepare(mode, case, k):
    parents, tokens, lens = case["steps"][k]
    return prepare_tree((parents, case["cu"]), tokens, case["slots"], lens, device="cpu", n_slots=N_SLOTS,
                        max_len=MAX_LEN, **tree_kwargs(mode, case))


def device_inputs(case, k):
    parents, tokens, lens = case["steps"][k]
    return (torch.tensor(parents, dtype=torch.int32), torch.tensor(tokens, dtype=torch.int64),
            torch.tensor([lens[s] for s in case["slots"]], dtype=torch.int64))


def expect_refilled(tb, want: dict) -> None:
    """A refilled bucket equals a fresh preparation, except a shallower forest's path table
    is -1 past its depth (the bucket keeps its max_depth)."""
    want = dict(want)
    d2, table = want.pop("max_depth"), want.pop("path_table")
    assert tb.max_depth >= d2
    assert torch.equal(tb.path_table[:, :d2], table)
    assert (tb.path_table[:, d2:] == -1).all()
    assert_same(tb, want)


# ---- (1) the refilled tree batch is the prepared one -------------------------------------

# the kernel (kernels.tree_metadata) writes the tree-only masks, the split and varlen modes
KERNEL_CASES = [(m, False) for m in MODES] + [("split", True), ("varlen", True)]
KERNEL_IDS = [m + ("-kernel" if k else "") for m, k in KERNEL_CASES]


@pytest.mark.parametrize("mode,kernel", KERNEL_CASES, ids=KERNEL_IDS)
@settings(max_examples=25)
@given(data=st.data())
def test_refill_tree_equals_prepare_tree(mode, kernel, data):
    case = draw_step(data, mode)
    tb = prepare(mode, case, 0)
    p1, _, l1 = case["steps"][0]
    assert_same(tb, legacy_prepare_tree((p1, case["cu"]), case["steps"][0][1], case["slots"], l1,
                                        **tree_kwargs(mode, case)))
    assert (tb.split_base is not None) == (mode == "split") and (tb.kv_used is not None) == (mode == "varlen")
    storage = {name: t.data_ptr() for name, t in tb.tensors().items()}
    signature = tb.signature()
    refill_tree(tb, *device_inputs(case, 1), ROPE, kernel=kernel)
    p2, t2, l2 = case["steps"][1]
    fresh = prepare(mode, case, 1)
    expect_refilled(tb, as_dict(fresh) | {"max_depth": fresh.max_depth})
    want = legacy_prepare_tree((p2, case["cu"]), t2, case["slots"], l2, **tree_kwargs(mode, case))
    del want["host_depths"]  # host fields are TreeInputs.load's
    expect_refilled(tb, want)
    assert {name: t.data_ptr() for name, t in tb.tensors().items()} == storage
    tight = tree_kwargs(mode, case) | {"kv_bucket": 1}  # kv_limit as small as the step allows
    want = legacy_prepare_tree((p2, case["cu"]), t2, case["slots"], l2, **tight)
    assert_same(prepare_tree((p2, case["cu"]), t2, case["slots"], l2, device="cpu", n_slots=N_SLOTS,
                             max_len=MAX_LEN, **tight), want)
    assert tb.signature() == signature


def test_refill_tree_a_forest_as_deep_as_the_bucket():
    """Chains filling the bucket's depth, several roots, one-node trees, 4 requests, G=4."""
    forest = pack_forest([chain_tree(6), random_tree(1, 5, 3, 2), chain_tree(1), random_tree(2, 6, 2, 3)])
    parents, cu = forest_arrays(forest)
    kw = dict(rope=ROPE, dtype=torch.float32, device="cpu", n_slots=N_SLOTS, max_len=MAX_LEN, gqa_group=4,
              n_gdn_layers=3, kv_bucket=MAX_LEN)
    tb = prepare_tree((parents, cu), list(range(len(parents))), [3, 1, 0, 5], [4, 0, 9, 0, 0, 2], **kw)
    new = [-1, 0, -1, 2, 3, -1] + [-1, 0, 1, 2, 3] + [-1] + [-1, 0, 1, 2, 3, 4]
    toks, lens = list(range(100, 100 + len(new))), [7, 0, 2, 0, 0, 11]
    refill_tree(tb, torch.tensor(new, dtype=torch.int32), torch.tensor(toks), torch.tensor([0, 0, 7, 11]), ROPE)
    want = prepare_tree((new, cu), toks, [3, 1, 0, 5], lens, **kw)
    assert want.max_depth == tb.max_depth == 6
    assert_same(tb, as_dict(want) | {"max_depth": 6})


# ---- (2) decode -----------------------------------------------------------------------------

@pytest.mark.parametrize("varlen", [False, True], ids=["mask", "varlen"])
@settings(max_examples=25)
@given(data=st.data())
def test_refill_decode_equals_prepare_decode(varlen, data):
    rng = random.Random(data.draw(st.integers(0, 2 ** 32 - 1)))
    bsz = data.draw(st.sampled_from([1, 2, 4]))
    slots = sorted(rng.sample(range(N_SLOTS), bsz)) if varlen else rng.sample(range(N_SLOTS), bsz)
    steps = [([rng.randrange(1000) for _ in slots], [rng.randrange(0, 40) for _ in range(N_SLOTS)])
             for _ in range(2)]
    kw = dict(rope=ROPE, dtype=torch.bfloat16, kv_bucket=MAX_LEN, varlen=varlen)
    db = prepare_decode(*steps[0][:1], slots, steps[0][1], device="cpu", n_slots=N_SLOTS, max_len=MAX_LEN, **kw)
    assert_same(db, legacy_prepare_decode(steps[0][0], slots, steps[0][1], **kw))
    assert (db.kv_used is not None) == varlen
    toks, lens = steps[1]
    refill_decode(db, torch.tensor(toks), torch.tensor([lens[s] for s in slots]), ROPE)
    assert_same(db, legacy_prepare_decode(toks, slots, lens, **kw))
    for lens in (lens, [lens[0]] * N_SLOTS):  # a tight read; equal lengths need no mask at all
        tight = kw | {"kv_bucket": 1}
        want = legacy_prepare_decode(toks, slots, lens, **tight)
        assert_same(prepare_decode(toks, slots, lens, device="cpu", n_slots=N_SLOTS, max_len=MAX_LEN, **tight), want)
    assert want["attn_bias"] is None and want["kv_used"] is None


# ---- (3) no host read inside the refill ----------------------------------------------------

class _SyncOps(TorchDispatchMode):
    """Records the aten ops that read a device value on the host or size a result by data."""

    BAD = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "repeat_interleave",
           "is_nonzero", "equal", "item")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.BAD or (name == "index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()))):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@contextmanager
def no_host_reads(monkeypatch):
    """Every Python-level way to read a tensor on the host raises; aten-level ones are
    recorded (and asserted absent on exit)."""
    def refuse(name):
        def raiser(*args, **kwargs):
            raise AssertionError(f"host read: Tensor.{name}")
        return raiser

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__bool__", "__index__", "__int__", "__float__", "nonzero", "cpu",
                     "numpy"):
            m.setattr(torch.Tensor, name, refuse(name))
        m.setattr(torch, "nonzero", refuse("nonzero"))
        with _SyncOps() as ops:
            yield
        assert not ops.seen, f"host reads: {ops.seen}"


@pytest.mark.parametrize("mode", MODES)
def test_refill_reads_nothing_back(mode, monkeypatch):
    case = dict(cu=[0, 3, 3, 7], slots=[0, 2, 4], gqa_group=4, n_gdn_layers=2, bias_dtype=None,
                steps=[([-1, 0, 0, -1, 0, 1, 2], list(range(7)), [5] * N_SLOTS),
                       ([-1, -1, 1, -1, -1, 1, 2], list(range(7, 14)), [5] * N_SLOTS if mode == "split"
                        else [3, 0, 8, 0, 2, 0])])
    tb = prepare(mode, case, 0)
    inputs = device_inputs(case, 1)
    db = prepare_decode([1, 2, 3], [0, 2, 4], [4, 0, 2, 0, 6, 0], rope=ROPE, dtype=torch.float32, device="cpu",
                        n_slots=N_SLOTS, max_len=MAX_LEN, kv_bucket=MAX_LEN, varlen=mode == "varlen")
    with no_host_reads(monkeypatch):
        refill_tree(tb, *inputs, ROPE)
        refill_decode(db, inputs[1][:3], inputs[2], ROPE)
    fresh = prepare(mode, case, 1)
    expect_refilled(tb, as_dict(fresh) | {"max_depth": fresh.max_depth})
    assert (tb.max_depth, fresh.max_depth) == (4, 3)


def test_the_host_read_guard_catches_a_violation(monkeypatch):
    """The guard would fail a refill that reads back: .item(), truth of a tensor, int(),
    boolean-mask indexing (data-dependent shape)."""
    x = torch.tensor([1, 2, 3])
    for bad in (lambda: x.max().item(), lambda: bool(x[0] > 1), lambda: int(x[0]), lambda: x.tolist(),
                lambda: range(10)[x[0]]):
        with pytest.raises(AssertionError, match="host read"):
            with no_host_reads(monkeypatch):
                bad()
    with pytest.raises(AssertionError, match="host reads"):
        with no_host_reads(monkeypatch):
            x[x > 1]
    real = tree_metadata.tree_structure

    def syncing(*args):
        out = real(*args)
        out[2].max().item()  # a depth check on the host: what refill_tree must not do
        return out

    monkeypatch.setattr(tree_metadata, "tree_structure", syncing)
    case = dict(cu=[0, 2], slots=[0], gqa_group=1, n_gdn_layers=0, bias_dtype=None,
                steps=[([-1, 0], [1, 2], [3] * N_SLOTS)])
    tb = prepare("dense", case, 0)
    with pytest.raises(AssertionError, match="host read"):
        with no_host_reads(monkeypatch):
            refill_tree(tb, *device_inputs(case, 0), ROPE)


# ---- (4) TreeInputs --------------------------------------------------------------------------

def _bucket(mode="dense"):
    case = dict(cu=[0, 4, 6], slots=[1, 3], gqa_group=2, n_gdn_layers=2, bias_dtype=None,
                steps=[([-1, 0, 1, 0, -1, 0], list(range(6)), [0, 6, 0, 6, 0, 0])])
    return prepare(mode, case, 0)


def test_tree_inputs_load_then_refill_equals_prepare():
    tb = _bucket()
    inputs = TreeInputs(tb)
    parents, tokens, base = [-1, -1, 1, 0, -1, -1], [9, 8, 7, 6, 5, 4], [10, 2]
    inputs.load(parents, torch.tensor(tokens), base)
    assert inputs.parents.data_ptr() == inputs._buffer.device.data_ptr() and inputs._buffer.device.numel() == 14
    refill_tree(tb, inputs.parents, inputs.tokens, inputs.base, ROPE)
    want = prepare_tree((parents, [0, 4, 6]), tokens, [1, 3], [0, 10, 0, 2, 0, 0], rope=ROPE, dtype=torch.bfloat16,
                        device="cpu", n_slots=N_SLOTS, max_len=MAX_LEN, gqa_group=2, n_gdn_layers=2,
                        kv_bucket=MAX_LEN)
    expect_refilled(tb, as_dict(want) | {"max_depth": want.max_depth})
    assert (tb.host_kv_lens, tb.host_depths, tb.host_single_root) == ([10, 2], want.host_depths, False)


@pytest.mark.parametrize("mode,parents,tokens,base,field", [
    ("dense", [-1, 0, 1], [1] * 6, [0, 0], "parents: 3 entries"),
    ("dense", [-1, 0, 1, 0, -1, 0], [1] * 5, [0, 0], "tokens: 5 entries"),
    ("dense", [-1, 0, 1, 0, -1, 0], [1] * 6, [0], "base: 1 entries"),
    ("dense", [-1, 0, 4, 0, -1, 0], [1] * 6, [0, 0], "parents: node 2 .* parent 4"),
    ("dense", [-1, 0, 1, 0, -1, -2], [1] * 6, [0, 0], "parents: node 5 .* parent -2"),
    ("dense", [-1, 0, 1, 2, -1, 0], [1] * 6, [0, 0], r"parents: node 3 .* 4 nodes on its root path.*max_depth"),
    ("dense", [-1, 0, 1, 0, -1, 0], [1] * 6, [-1, 0], "base: request 0 has committed length -1"),
    ("dense", [-1, 0, 1, 0, -1, 0], [1] * 6, [0, MAX_LEN - 1], "base: request 1 .*kv_limit"),
    ("dense", [-1, 0, 1, 0, -1, 0], [1, 2, 3, "x", 5, 6], [0, 0], "tokens: every entry must be an integer"),
    ("split", [-1, 0, 1, 0, -1, 0], [1] * 6, [6, 7], "base: request 1 .* bakes in 6"),
    ("varlen", [-1, 0, 1, 0, -1, 0], [1] * 6, [0, 3], "base: request 0 has no committed key"),
])
def test_tree_inputs_refuse_what_the_bucket_cannot_hold(mode, parents, tokens, base, field):
    tb = _bucket(mode)
    assert (tb.split_base == 6) == (mode == "split") and (tb.kv_used is not None) == (mode == "varlen")
    inputs = TreeInputs(tb)
    before = inputs._buffer.host.clone()
    with pytest.raises(InputError, match=field):
        inputs.load(parents, tokens, base)
    assert torch.equal(inputs._buffer.host, before)  # nothing written


def test_decode_inputs_load_then_refill_equals_prepare():
    kw = dict(rope=ROPE, dtype=torch.bfloat16, device="cpu", n_slots=N_SLOTS, max_len=MAX_LEN, kv_bucket=MAX_LEN)
    db = prepare_decode([1, 2], [3, 1], [0, 5, 0, 9, 0, 0], **kw)
    inputs = DecodeInputs(db)
    inputs.load([7, 8], [11, 4])
    refill_decode(db, inputs.tokens, inputs.base, ROPE)
    want = prepare_decode([7, 8], [3, 1], [0, 4, 0, 11, 0, 0], **kw)
    assert_same(db, legacy_prepare_decode([7, 8], [3, 1], [0, 4, 0, 11, 0, 0], rope=ROPE, dtype=torch.bfloat16,
                                          kv_bucket=MAX_LEN, varlen=False))
    assert db.host_kv_lens == want.host_kv_lens == [11, 4]


@pytest.mark.parametrize("kv_bucket,tokens,base,field", [
    (MAX_LEN, [1], [0, 0], "tokens: 1 entries"),
    (MAX_LEN, [1, 2], [0, MAX_LEN], "base: request 1 .*kv_limit"),
    (MAX_LEN, [1, 2], [-1, 0], "base: request 0 has committed length -1"),
    (1, [1, 2], [5, 4], "base: request 1 .* bakes in 5"),
])
def test_decode_inputs_refuse_what_the_bucket_cannot_hold(kv_bucket, tokens, base, field):
    db = prepare_decode([1, 2], [0, 1], [5, 5], rope=ROPE, dtype=torch.bfloat16, device="cpu", n_slots=N_SLOTS,
                        max_len=MAX_LEN, kv_bucket=kv_bucket)
    inputs = DecodeInputs(db)
    with pytest.raises(InputError, match=field):
        inputs.load(tokens, base)


@pytest.mark.parametrize("mode", MODES)
def test_refill_runs_on_meta_tensors(mode):
    """On the meta device no value exists: a refill that picked a shape or a branch from
    one (nonzero, a mask index, .item()) would raise, so this one never does."""
    case = dict(cu=[0, 3, 5], slots=[0, 1], gqa_group=2, n_gdn_layers=2, bias_dtype=None,
                steps=[([-1, 0, 0, -1, 0], [1, 2, 3, 4, 5], [4, 4, 0, 0, 0, 0] if mode == "split"
                        else [3, 5, 0, 0, 0, 0])])
    tb = prepare(mode, case, 0)
    for name, t in tb.tensors().items():
        setattr(tb, name, t.to("meta"))
    parents, tokens, base = (t.to("meta") for t in device_inputs(case, 0))
    refill_tree(tb, parents, tokens, base, ROPE)
    db = prepare_decode([1, 2], [0, 1], [3, 5], rope=ROPE, dtype=torch.float32, device="cpu", n_slots=2,
                        max_len=MAX_LEN, kv_bucket=MAX_LEN, varlen=mode == "varlen")
    for name, t in db.tensors().items():
        setattr(db, name, t.to("meta"))
    refill_decode(db, tokens[:2], base, ROPE)
    with pytest.raises((NotImplementedError, RuntimeError)):
        base[base > 3]  # what the meta device refuses


@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "kernel"])
@pytest.mark.parametrize("depth", [2, 9, 37])
def test_refill_tree_long_chains(depth, kernel):
    """Pointer jumping past powers of two (the kernel: walks as long as the bucket): a chain
    of `depth` nodes refills a bucket that a branching tree of the same depth was prepared
    for, and a one-node-shallower one too."""
    kw = dict(rope=ROPE, dtype=torch.float32, device="cpu", n_slots=N_SLOTS, max_len=MAX_LEN, gqa_group=1,
              n_gdn_layers=1, kv_bucket=MAX_LEN, varlen=kernel)
    size = depth + 3
    first = list(range(-1, depth - 1)) + [0, 0, -1]
    tb = prepare_tree((first, [0, size]), [0] * size, [2], [0, 0, 5, 0, 0, 0], **kw)
    assert tb.max_depth == depth
    for parents in ([-1] * 4 + list(range(3, size - 1)), [-1] + list(range(0, depth - 2)) + [-1] * 4):
        refill_tree(tb, torch.tensor(parents), torch.arange(size), torch.tensor([9]), ROPE, kernel=kernel)
        want = prepare_tree((parents, [0, size]), list(range(size)), [2], [0, 0, 9, 0, 0, 0], **kw)
        expect_refilled(tb, as_dict(want) | {"max_depth": want.max_depth})
    assert want.max_depth == depth - 1


# ---- (6) the kernel: big trees, GQA groups, its refusal, and its bounds ------------------

@pytest.mark.parametrize("group", [1, 2, 4])
def test_kernel_refill_of_256_node_trees(group):
    """Two 256-node requests (a random tree of depth 12 with several roots, a wide one) and
    a 100-node chain: the kernel's refill equals the torch ops', field by field."""
    trees = [random_tree(11, 256, 12, 3), random_tree(12, 256, 3), chain_tree(100)]
    forest = pack_forest(trees)
    parents, cu = forest_arrays(forest)
    kw = dict(rope=ROPE, dtype=torch.bfloat16, device="cpu", n_slots=3, max_len=400, gqa_group=group,
              n_gdn_layers=2, split=True, bias_dtype=torch.float32)
    tb = prepare_tree((parents, cu), list(range(len(parents))), [0, 1, 2], [30, 30, 30], **kw)
    def copy(v):  # the mask with its padded rows (assert_same compares those too)
        return v._base.clone()[..., :v.shape[-1]]

    want = {k: copy(v) if k == "tree_bias" else v.clone() if isinstance(v, torch.Tensor) else v
            for k, v in as_dict(tb).items()}
    kept = ("slots", "cu_seqlens", "node_slot", "pad_index", "layer_slots", "layer_cu_seqlens")  # the bucket's
    for name, t in tb.tensors().items():
        if name not in kept:
            t.fill_(3)
    refill_tree(tb, torch.tensor(parents), torch.arange(len(parents)), torch.tensor([30, 30, 30]), ROPE,
                kernel=True)
    assert_same(tb, want)


def test_kernel_refill_refuses_the_dense_mask():
    tb = _bucket("dense")
    with pytest.raises(InputError, match="dense"):
        refill_tree(tb, tb.parents, tb.tokens, tb.base, ROPE, kernel=True)


def test_kernel_stays_inside_its_arguments_whatever_the_parents_say():
    """Parents past the node, past the tree, below -1, cycles: every output lives inside a
    larger buffer whose guard entries must come back untouched, and each walk ends."""
    from bole_cli.kernels.tree_metadata import tree_metadata

    bsz, t, d, half, group, layers = 2, 8, 4, 4, 2, 3
    sizes = [8, 5]
    n = sum(sizes)
    cu = torch.tensor([0, 8, 13], dtype=torch.int32)
    parents = torch.tensor([-1, 5, 99, -7, 3, 2, 6, 1] + [4, 4, -1, 2**40, 0])
    guard = 12345

    def boxed(shape, dtype, fill=guard):
        numel = 1
        for x in shape:
            numel *= x
        box = torch.full((numel + 64,), fill, dtype=dtype)
        return box, box[32:32 + numel].view(shape)

    spec = dict(tokens=((n,), torch.int64), parents=((n,), torch.int32), base=((bsz,), torch.int64),
                depths=((n,), torch.int64), positions=((n,), torch.int64), kv_pos=((n,), torch.int64),
                cos=((n, half), torch.float32), sin=((n, half), torch.float32),
                path_table=((n, d), torch.int64), parent_rows=((t, bsz), torch.int64),
                sglang_parents=((bsz, t), torch.int64), layer_parents=((layers * n,), torch.int32),
                kv_used=((bsz,), torch.int32), tree_bias=((bsz, 1, t * group, t), torch.float32))
    boxes, outs = {}, {}
    for name, (shape, dtype) in spec.items():
        boxes[name], outs[name] = boxed(shape, dtype)
    rope_cos, rope_sin = ROPE.rows(16, "cpu")
    tree_metadata(parents, torch.arange(n), torch.tensor([3, 2**20]), cu, rope_cos, rope_sin, max_nodes=t,
                  max_depth=d, group=group, **outs)
    for name, box in boxes.items():
        assert (box[:32] == guard).all() and (box[-32:] == guard).all(), name
    assert (outs["depths"] >= 0).all() and (outs["depths"] < d).all()
    assert torch.equal(outs["cos"][8:], torch.zeros(5, half))  # positions past the rope rows: zeros
    # request sizes that run past the nodes, or start before them
    for bad in ([0, 8, 100], [0, -4, 13], [0, 13, 9]):
        for name, (shape, dtype) in spec.items():
            boxes[name], outs[name] = boxed(shape, dtype)
        tree_metadata(parents, torch.arange(n), torch.tensor([3, 5]), torch.tensor(bad, dtype=torch.int32),
                      rope_cos, rope_sin, max_nodes=t, max_depth=d, group=group, **outs)
        for name, box in boxes.items():
            assert (box[:32] == guard).all() and (box[-32:] == guard).all(), (bad, name)


@pytest.mark.parametrize("mode", ["split", "varlen"])
def test_kernel_refill_of_an_all_empty_forest(mode):
    """No node in any request: the kernel still writes the lengths, the parent rows and the
    mask's padded rows, as the torch ops do."""
    lens = [5, 5, 0, 0, 0, 0] if mode == "split" else [5, 7, 0, 0, 0, 0]
    kw = dict(rope=ROPE, dtype=torch.bfloat16, device="cpu", n_slots=N_SLOTS, max_len=MAX_LEN, gqa_group=2,
              n_gdn_layers=2, split=mode == "split", varlen=mode == "varlen", bias_dtype=torch.float32)
    tb = prepare_tree(([], [0, 0, 0]), [], [0, 1], lens, **kw)
    want = {k: v.clone() for k, v in tb.tensors().items()}
    for name in ("base", "parent_rows", "sglang_parents", "tree_bias") + (("kv_used",) if mode == "varlen" else ()):
        getattr(tb, name).fill_(3)
    refill_tree(tb, torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int64), torch.tensor(lens[:2]),
                ROPE, kernel=True)
    for name, t in tb.tensors().items():
        assert torch.equal(t, want[name]), name


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["split", "varlen"])
def test_kernel_refill_on_cuda_equals_the_torch_ops(mode):
    """On the GPU (the kernel's default there): random forests of 32 and 256 nodes a request,
    the kernel's refill against the torch ops', field by field, bitwise."""
    for size, seed in ((32, 1), (256, 2)):
        trees = [random_tree(seed * 10 + b, size, 8 if size == 32 else 20, 2) for b in range(3)]
        parents, cu = forest_arrays(pack_forest(trees))
        lens = [40, 40, 40] if mode == "split" else [40, 17, 300]
        kw = dict(rope=ROPE, dtype=torch.bfloat16, device="cuda", n_slots=3, max_len=1024, gqa_group=4,
                  n_gdn_layers=3, split=mode == "split", varlen=mode == "varlen", bias_dtype=torch.float32)
        tb = prepare_tree((parents, cu), list(range(len(parents))), [0, 1, 2], lens, **kw)
        inputs = (torch.tensor(parents, device="cuda"), torch.arange(len(parents), device="cuda"),
                  torch.tensor(lens, device="cuda"))
        refill_tree(tb, *inputs, ROPE, kernel=False)
        want = {k: v.clone() for k, v in tb.tensors().items()}
        for name, t in tb.tensors().items():
            if name in ("tokens", "depths", "positions", "kv_pos", "path_table", "cos", "sin", "tree_bias"):
                t.fill_(3)
        refill_tree(tb, *inputs, ROPE, kernel=True)
        for name, t in tb.tensors().items():
            assert torch.equal(t, want[name]), (size, name)


def test_kernel_reads_strided_input_vectors_as_their_values():
    """tree_metadata reads its four input vectors as raw memory: a strided view (every
    other element of a bigger vector, or an expanded one) is copied first, so the outputs
    are the contiguous call's and nothing beside the view is read."""
    from bole_cli.kernels import tree_metadata

    bsz, nodes, depth, half = 2, 4, 4, 2
    parents = torch.tensor([-1, 0, 1, 0, -1, 0, 1, 2], dtype=torch.int64)
    tokens = torch.arange(100, 108, dtype=torch.int64)
    base = torch.tensor([5, 5], dtype=torch.int64)
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    n = parents.numel()
    gen = torch.Generator().manual_seed(2)
    rope_cos, rope_sin = torch.rand(32, half, generator=gen), torch.rand(32, half, generator=gen)

    def run(*inputs):
        outs = dict(tokens=torch.zeros(n, dtype=torch.int64), parents=torch.zeros(n, dtype=torch.int32),
                    base=torch.zeros(bsz, dtype=torch.int64), depths=torch.zeros(n, dtype=torch.int64),
                    positions=torch.zeros(n, dtype=torch.int64), kv_pos=torch.zeros(n, dtype=torch.int64),
                    cos=torch.zeros(n, half), sin=torch.zeros(n, half),
                    path_table=torch.zeros(n, depth, dtype=torch.int64),
                    parent_rows=torch.zeros(nodes, bsz, dtype=torch.int64),
                    sglang_parents=torch.zeros(bsz, nodes, dtype=torch.int64),
                    layer_parents=torch.zeros(n, dtype=torch.int32))
        tree_metadata(*inputs, rope_cos, rope_sin, max_nodes=nodes, max_depth=depth, **outs)
        return outs

    def every_other(t, fill):
        return torch.stack([t, torch.full_like(t, fill)], -1)[..., 0]

    want = run(parents, tokens, base, cu)
    for i, fill in enumerate((7, -999, 1000, 3)):
        inputs = [parents, tokens, base, cu]
        inputs[i] = every_other(inputs[i], fill)
        got = run(*inputs)
        assert all(torch.equal(got[key], want[key]) for key in want), i
    beside = torch.tensor([5, 999], dtype=torch.int64)
    got = run(parents, tokens, beside[:1].expand(bsz), cu)
    assert all(torch.equal(got[key], want[key]) for key in want)
