"""The fused one-token decode kernel (kernels/gdn_decode.py) against its float64 reference,
and against the tree kernels' one-node path that it replaces in the runtime.

CPU: Triton's interpreter, float32 arithmetic (the kernel's bf16 roundings are identities
here, so the reference's exact float64 applies at float32 tolerance).
"""

from __future__ import annotations

import pytest
import torch
import triton
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from bole_cli.errors import InputError
from bole_cli.kernels.gdn_decode import gdn_decode
from bole_cli.kernels.reference import gdn_decode_ref
from shuffled_grid import shuffled_grid
from strided_pools import LAYOUTS, clone_strided, pad_of, state_of

SETTINGS = settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
F32 = torch.float32


def make(seed, bsz=3, hk=2, group=2, kdim=16, vdim=8, width=4, slots=6, decay=(-2.0, 0.0), bias=False,
         norm=True, dtype=F32, conv_layout="sdw", state_layout="dense"):
    gen = torch.Generator().manual_seed(seed)
    hv = hk * group
    dim = 2 * hk * kdim + hv * vdim

    def r(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=F32).mul_(std).to(dtype)

    if conv_layout == "swd":  # SGLang's [S, W-1, D] storage, seen as [S, D, W-1]
        conv = r(slots, width - 1, dim).transpose(1, 2)
    else:
        conv = r(slots, dim, width - 1)
    lo, hi = decay  # g = -exp(A_log) softplus(a + dt_bias), softplus ~ 0.1-3: |g| spans about |hi|..|lo|
    a_raw = r(bsz, hv)
    perm = torch.randperm(slots, generator=gen)[:bsz]
    case = dict(
        x=r(bsz, dim), conv_state=conv, conv_w=r(dim, width, std=width ** -0.5),
        conv_b=r(dim, std=0.1) if bias else None, a=a_raw, b=r(bsz, hv),
        A_log=torch.empty(hv).uniform_(max(-hi, 1e-6), -lo, generator=gen).log().to(dtype),
        dt_bias=r(hv, std=0.5), state=state_of(r(slots, hv, vdim, kdim, std=0.1), state_layout),
        state_indices=perm,
        key_heads=hk)
    if norm:
        case.update(z=r(bsz, hv * vdim), norm_w=r(vdim).abs().add_(0.5))
    return case


def run(case, **kw):
    c = {k: (v.clone() if isinstance(v, torch.Tensor) and k == "conv_state" else v) for k, v in case.items()}
    c["state"] = clone_strided(case["state"])
    out = gdn_decode(**c, **kw)
    return out, c["state"], c["conv_state"]


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-30))


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), bsz=st.integers(1, 4), group=st.sampled_from([1, 2, 4]),
       kdim=st.sampled_from([16, 32]), vdim=st.sampled_from([8, 16]), width=st.sampled_from([2, 4]),
       decay=st.sampled_from([(-1e-4, -1e-6), (-2.0, -0.01), (-30.0, -1e-4)]),
       bias=st.booleans(), norm=st.booleans(), layout=st.sampled_from(["sdw", "swd"]),
       state_layout=st.sampled_from(LAYOUTS))
@example(seed=3, bsz=2, group=4, kdim=32, vdim=16, width=4, decay=(-30.0, -1e-4), bias=True, norm=True,
         layout="swd", state_layout="padded")
@example(seed=6, bsz=3, group=2, kdim=16, vdim=8, width=4, decay=(-2.0, -0.01), bias=False, norm=True,
         layout="sdw", state_layout="heads-inner")
def test_decode_matches_float64_reference(seed, bsz, group, kdim, vdim, width, decay, bias, norm, layout,
                                          state_layout):
    case = make(seed, bsz=bsz, group=group, kdim=kdim, vdim=vdim, width=width, decay=decay, bias=bias,
                norm=norm, conv_layout=layout, state_layout=state_layout)
    out, state, conv = run(case)
    assert state.stride() == case["state"].stride()
    if state_layout == "padded":
        assert pad_of(state).isnan().all()  # the pool's gaps are never written
    want, want_state, want_conv = gdn_decode_ref(**{**case, "state": case["state"].contiguous()})
    assert rel(out, want) < 2e-5
    assert rel(state, want_state) < 2e-5
    torch.testing.assert_close(conv, want_conv, rtol=0, atol=0)  # the slide is a copy
    untouched = [s for s in range(case["state"].shape[0]) if s not in case["state_indices"].tolist()]
    assert torch.equal(state[untouched], case["state"][untouched])
    assert torch.equal(conv[untouched], case["conv_state"][untouched])


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), bsz=st.integers(2, 4), group=st.sampled_from([1, 2, 4]),
       vdim=st.sampled_from([24, 32, 64]), split=st.sampled_from([2, 4, 8]), norm=st.booleans(),
       decay=st.sampled_from([(-1e-4, -1e-6), (-30.0, -1e-4)]), warps=st.sampled_from([None, 1, 2, 4]))
@example(seed=4, bsz=3, group=2, vdim=24, split=4, norm=True, decay=(-30.0, -1e-4), warps=None)
@example(seed=5, bsz=2, group=4, vdim=64, split=8, norm=True, decay=(-30.0, -1e-4), warps=1)
def test_value_split_decode_matches_the_whole_head(seed, bsz, group, vdim, split, norm, decay, warps):
    """value_split: each head's value rows over several programs (the last to arrive applies
    the gated norm over the whole head): the float64 reference's outputs, states and windows,
    V not a power of two included (a tile past V holds no rows), the split counters left at
    zero for the next launch. The programs run in a shuffled order (tests/shuffled_grid.py),
    so a head's last arriver is any of its tiles and heads interleave, as on the GPU."""
    from bole_cli.kernels.skinny_mm import reserve_counters
    assume(triton.next_power_of_2(vdim) // split >= 8)
    case = make(seed, bsz=bsz, group=group, kdim=16, vdim=vdim, decay=decay, norm=norm)
    case["state_indices"][-1] = 99  # a slot outside the pool: NaN rows, nothing written
    with shuffled_grid(seed):
        out, state, conv = run(case, value_split=split, num_warps=warps)
    assert torch.isnan(out[-1]).all()
    rows = ("x", "a", "b", "z", "state_indices")
    inside = {k: (v[: bsz - 1] if k in rows and v is not None else v) for k, v in case.items()}
    want, want_state, want_conv = gdn_decode_ref(**inside)  # the requests inside the pool
    assert rel(out[: bsz - 1], want) < 2e-5
    assert rel(state, want_state) < 2e-5
    assert torch.equal(conv, want_conv)
    assert int(reserve_counters("cpu").abs().sum()) == 0


@pytest.mark.parametrize("split", [0, 3, True, 4])
def test_value_split_refusals(split):
    """A split must be a power of two leaving at least 8 value rows to each program (V 16:
    at most 2)."""
    with pytest.raises(InputError, match="value_split"):
        gdn_decode(**make(2, vdim=16), value_split=split)


@pytest.mark.parametrize("warps", [0, 3, 32, True])
def test_num_warps_refusals(warps):
    """A program's warps: a power of two from 1 to 16."""
    with pytest.raises(InputError, match="num_warps"):
        gdn_decode(**make(2, vdim=16), num_warps=warps)


def test_the_launch_rule_takes_the_first_row_that_holds_the_heads(monkeypatch):
    """limits.gdn_decode_launch: rows by the heads a step updates (batch x value heads), the
    first whose limit holds; None holds any; past every limit, the last row. The kernel takes
    the rule's launch by default (its split capped so a program keeps 8 value rows), and a
    caller's split with a head's 8 warps spread over it."""
    import importlib

    from bole_cli import limits

    mod = importlib.import_module("bole_cli.kernels.gdn_decode")  # the module (the package exports the function)

    monkeypatch.setattr(limits, "GDN_DECODE_LAUNCH", ((32, 16, 1), (512, 4, 2), (None, 1, 8)))
    assert [limits.gdn_decode_launch(h) for h in (1, 32, 33, 512, 513)] == [(16, 1), (16, 1), (4, 2), (4, 2), (1, 8)]
    monkeypatch.setattr(limits, "GDN_DECODE_LAUNCH", ((8, 2, 4),))
    assert limits.gdn_decode_launch(9) == (2, 4)
    seen = []

    class Spy:  # the launch's grid and warps, the kernel not run
        def __getitem__(self, grid):
            return lambda *a, **kw: seen.append((grid[2], kw["num_warps"]))

    monkeypatch.setattr(mod, "_gdn_decode_kernel", Spy())
    monkeypatch.setattr(limits, "GDN_DECODE_LAUNCH", ((4, 2, 1), (None, 1, 8)))
    gdn_decode(**make(2, bsz=2, group=1, vdim=16))  # 2 requests x 2 heads: the first row
    gdn_decode(**make(2, bsz=3, group=1, vdim=16))  # 6 heads: the second
    gdn_decode(**make(2, bsz=3, group=1, vdim=16), value_split=2)  # 8 // 2 warps
    monkeypatch.setattr(limits, "GDN_DECODE_LAUNCH", ((None, 16, 1),))
    gdn_decode(**make(2, bsz=3, group=1, vdim=16))  # 16 rows a head: the split capped at 2
    assert seen == [(2, 1), (1, 8), (2, 4), (2, 1)]


def test_past_the_split_counters_the_rule_takes_whole_heads(monkeypatch):
    """More heads in a step than split counters: the rule's launch falls back to whole heads
    (no counters) and matches the reference; a caller's split there is refused before any
    launch, the windows and the states untouched."""
    import importlib

    mod = importlib.import_module("bole_cli.kernels.gdn_decode")
    monkeypatch.setattr(mod, "COUNTERS", 4)  # 3 requests x 2 heads: past them
    case = make(3, bsz=3, group=1, vdim=16, norm=True)
    out, state, conv = run(case)
    want, want_state, want_conv = gdn_decode_ref(**case)
    assert rel(out, want) < 2e-5 and rel(state, want_state) < 2e-5 and torch.equal(conv, want_conv)
    keep = {k: case[k].clone() for k in ("state", "conv_state")}
    with pytest.raises(InputError, match="split counters"):
        gdn_decode(**case, value_split=2)
    assert all(torch.equal(case[k], v) for k, v in keep.items())


def test_decode_is_the_one_node_tree():
    """The same step through the tree kernels the runtime used before (conv, gates, verify,
    replay commit): one-node trees are plain decoding."""
    from bole_cli.kernels import gdn_gates, tree_commit_replay, tree_conv, tree_verify

    case = make(5, bsz=3, group=2, norm=False)
    out, state, conv = run(case)
    bsz = case["x"].shape[0]
    parents = torch.full((bsz,), -1, dtype=torch.int32)
    cu = torch.arange(bsz + 1, dtype=torch.int32)
    st_ref, conv_ref = case["state"].clone(), case["conv_state"].clone()
    y = tree_conv(case["x"], conv_ref, case["conv_w"], None, case["state_indices"], parents, cu, activation=True)
    hk, kdim = 2, 16
    q = y[:, : hk * kdim].view(bsz, hk, kdim)
    k = y[:, hk * kdim: 2 * hk * kdim].view(bsz, hk, kdim)
    v = y[:, 2 * hk * kdim:].reshape(bsz, 4, 8)
    g, beta = gdn_gates(case["A_log"], case["a"], case["dt_bias"], case["b"])
    o = tree_verify(q, k, v, g, beta, st_ref, case["state_indices"], parents, cu).o
    tree_commit_replay(st_ref, case["state_indices"], k, v, g, beta, parents, cu, torch.zeros(bsz, dtype=torch.int64))
    assert rel(out, o.reshape(bsz, -1)) < 2e-5
    assert rel(state, st_ref) < 2e-5


def test_slot_outside_the_pool_writes_nothing():
    case = make(7, bsz=2)
    case["state_indices"] = torch.tensor([1, 99])
    out, state, conv = run(case)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()
    keep = [s for s in range(case["state"].shape[0]) if s != 1]
    assert torch.equal(state[keep], case["state"][keep])
    assert torch.equal(conv[keep], case["conv_state"][keep])


@pytest.mark.parametrize("change, message", [
    (dict(key_heads=3), "key_heads"),
    (dict(x=torch.zeros(3, 7)), "x:"),
    (dict(z=None), "z and norm_w"),
    (dict(a=torch.zeros(3, 5)), "a:"),
    (dict(state_indices=torch.zeros(2, dtype=torch.int64)), "state_indices"),
    (dict(conv_w=torch.zeros(4, 4)), "conv_w"),
])
def test_bad_input_names_the_argument(change, message):
    case = make(1)
    case.update(change)
    with pytest.raises(InputError, match=message):
        gdn_decode(**case)


def gpu_9b_case(seed):
    """A 9B layer's decode on the GPU: bf16 activations, the gates' parameters and the state
    in float32 (as the runtime holds them)."""
    from bole_cli.catalog.models import resolve_model

    s = resolve_model("9b")
    case = make(seed, bsz=4, hk=s.gdn_key_heads, group=s.gdn_value_heads // s.gdn_key_heads, kdim=s.gdn_key_dim,
                vdim=s.gdn_value_dim, width=s.conv_kernel, slots=8, dtype=torch.bfloat16)
    case = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    for name in ("A_log", "dt_bias", "state"):
        case[name] = case[name].float()
    return case


@pytest.mark.gpu
@pytest.mark.parametrize("split,warps", [(1, 8), (4, 2), (8, 2), (16, 1), (None, None)])
def test_decode_bf16_on_gpu_near_the_rounding_floor(split, warps):
    """At a 9B layer's shapes with bf16 activations and a float32 state: o within a few bf16
    roundings of float64 (the kernel rounds the conv output and o as the unfused path does),
    the state close to float32; whole heads, heads split over 4-16 programs (the last one
    normalising the head after the others' rows: ordering on the device) and the rule's
    default launch."""
    case = gpu_9b_case(11)
    out, state, conv = run(case, value_split=split, num_warps=warps)
    want, want_state, want_conv = gdn_decode_ref(**case)
    floor = float((want.to(torch.bfloat16).double() - want).norm() / want.norm())
    o_rel = float((out.double() - want).norm() / want.norm())
    s_rel = float((state.double() - want_state).norm() / want_state.norm())
    assert o_rel <= 4 * floor, (o_rel, floor)
    assert s_rel <= 1e-3, s_rel
    assert torch.equal(conv, want_conv)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay != "dense"])
def test_decode_on_gpu_in_any_pool_layout_matches_the_dense_pool(layout):
    """Each row stride compiles its own kernel (the stride a constant): on the device, a pool
    whose rows are not K apart gives the dense pool's o and state bit for bit at a 9B layer's
    shapes and the rule's launch, and its pad columns stay unwritten."""
    case = gpu_9b_case(12)
    other = dict(case, state=state_of(case["state"], layout))
    out, state, conv = run(case)
    got, got_state, got_conv = run(other)
    assert got_state.stride() != state.stride()
    assert torch.equal(got, out) and torch.equal(got_state, state) and torch.equal(got_conv, conv)
    if layout == "padded":
        assert pad_of(got_state).isnan().all()
