"""The skinny GEMM (kernels/skinny_mm.py) against a float64 product: rows 1-64, shapes that
leave partial tiles in N and K, K split across programs (the last slice adds the partials
and resets its counter), strided rows, out=, its bounds and its refusals; the fused residual
add + RMSNorm before the product and SwiGLU after it against the same in float64.

CPU: Triton's interpreter; float32 inputs take IEEE dots there, so the float64 product
applies at float32 tolerance; bf16 with the interpreter's bf16 dot made the GPU's. On the GPU: bf16 against cuBLAS at the decode shapes.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bole_cli.errors import InputError
from bole_cli.kernels import skinny_mm
from bole_cli.kernels.configs import launch_config
from bole_cli.limits import SKINNY_MM_MAX_ROWS
from shuffled_grid import shuffled_grid

module = importlib.import_module("bole_cli.kernels.skinny_mm")  # the module (its counters), not the function

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def rule(m, n, k, sms=132):
    """The launch skinny_mm takes by default on a GPU of `sms` SMs."""
    return launch_config("skinny_mm", {"M": m, "N": n, "K": k, "SMS": sms})


def rand(gen, *shape):
    return torch.randn(*shape, generator=gen)


def assert_product(y, x, w):
    want = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T  # the sum of |terms|: float32's error bound
    assert ((y.double() - want).abs() <= 1e-6 * scale + 1e-6).all()


@SETTINGS
@given(m=st.integers(1, SKINNY_MM_MAX_ROWS), n=st.integers(1, 80), k=st.integers(1, 700),
       bn=st.sampled_from([16, 32]), bk=st.sampled_from([16, 64, 128]), split=st.sampled_from([1, 2, 4, 8]),
       seed=st.integers(0, 2 ** 16))
def test_matches_the_float64_product(m, n, k, bn, bk, split, seed):
    """Against float64, K split across programs that run in a shuffled order
    (tests/shuffled_grid.py): any slice may be the last to arrive, as on the GPU."""
    gen = torch.Generator().manual_seed(seed)
    x, w = rand(gen, m, k), rand(gen, n, k)
    with shuffled_grid(seed):
        y = skinny_mm(x, w, config={"BN": bn, "BK": bk, "SPLIT_K": split})
    assert y.shape == (m, n) and y.dtype == x.dtype
    assert_product(y, x, w)
    assert (module._COUNTERS.get("cpu", torch.zeros(1, dtype=torch.int32)) == 0).all()  # reset for the next


@pytest.mark.parametrize("m, n, k, split", [(1, 48, 300, 1), (7, 33, 520, 4), (64, 20, 96, 2)])
def test_bf16_matches_the_float64_product(gpu_like_bf16_dots, m, n, k, split):
    """bfloat16 operands (the serving dtype), products summed in float32 as on the GPU
    (tests/conftest.py: gpu_like_bf16_dots): each output within one bf16 unit of the exact
    product on the same rounded inputs (the interpreter casts float32 to bf16 toward zero,
    the GPU to nearest), plus float32's summation bound."""
    gen = torch.Generator().manual_seed(m * n + k)
    x, w = rand(gen, m, k).bfloat16(), rand(gen, n, k).bfloat16()
    with shuffled_grid(k):
        y = skinny_mm(x, w, config={"BN": 16, "BK": 64, "SPLIT_K": split})
    assert y.dtype == torch.bfloat16
    want = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    assert ((y.double() - want).abs() <= 2 ** -7 * want.abs() + 1e-6 * scale + 1e-6).all()


def fused_reference(x, w, residual, norm, eps, glu):
    """float64: a = x (+ residual), h = rms(a) * norm, y = h @ w.T (silu(gate) * up with glu),
    and the float32 error bound of each output (the sum of |terms| of the product, carried
    through the SwiGLU)."""
    a = x.double() + (residual.double() if residual is not None else 0)
    h = a if norm is None else a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + eps) * norm.double()
    y, scale = h @ w.double().T, h.abs() @ w.double().abs().T
    err = 1e-5 * scale + 1e-6
    if glu:
        (g, u), (eg, eu) = y.chunk(2, -1), err.chunk(2, -1)
        y, err = torch.nn.functional.silu(g) * u, 1.1 * eg * u.abs() + g.abs() * eu + eg * eu
    return a, y, err


@SETTINGS
@given(m=st.integers(1, SKINNY_MM_MAX_ROWS), n=st.integers(1, 40), k=st.integers(1, 400),
       bn=st.sampled_from([16, 32]), bk=st.sampled_from([16, 64]), split=st.sampled_from([1, 2, 4]),
       add=st.booleans(), norm=st.booleans(), glu=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_fused_add_norm_and_glu_match_float64(m, n, k, bn, bk, split, add, norm, glu, seed):
    gen = torch.Generator().manual_seed(seed)
    x, w = rand(gen, m, k), rand(gen, 2 * n if glu else n, k)
    scale = 10 ** (4 * torch.rand(m, 1, generator=gen) - 2)  # rows of 0.01-100 rms
    x = x * scale
    res = rand(gen, m, k) * scale if add and norm else None
    nw = rand(gen, k) if norm else None
    total = torch.full((m, k), 7.0) if res is not None else None
    with shuffled_grid(seed):  # any slice may be the last to arrive, as on the GPU
        y = skinny_mm(x, w, residual=res, norm=nw, eps=1e-6 if norm else None, sum_out=total, glu=glu,
                      config={"BN": bn, "BK": bk, "SPLIT_K": split})
    a, want, err = fused_reference(x, w, res, nw, 1e-6, glu)
    assert y.shape == (m, n)
    assert ((y.double() - want).abs() <= err).all()
    if total is not None:
        assert torch.equal(total, x + res)  # the residual stream's sum, rounded as torch rounds it
    assert (module._COUNTERS.get("cpu", torch.zeros(1, dtype=torch.int32)) == 0).all()


@SETTINGS
@given(m=st.integers(1, SKINNY_MM_MAX_ROWS), n=st.integers(1, 40), heads=st.integers(1, 6),
       g=st.sampled_from([4, 16, 32]), bk=st.sampled_from([16, 64]), split=st.sampled_from([1, 2, 4]),
       bn=st.sampled_from([16, 32]), head=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_per_head_operands_match_float64(m, n, heads, g, bk, split, bn, head, seed):
    """x * sigmoid(gate) (an attention output, its gate heads strided as in the fused
    projection) or rms(head) * head_norm * silu(z) (a GDN output), then the product."""
    gen = torch.Generator().manual_seed(seed)
    k = heads * g
    x = rand(gen, m, k) * 10 ** (4 * torch.rand(m, 1, generator=gen) - 2)
    w = rand(gen, n, k)
    wide = rand(gen, m, heads, 2 * g) * 3  # gate = the second half of each head, as attn_in leaves it
    aux, hn = (rand(gen, m, heads, g) * 3, rand(gen, g)) if head else (wide[..., g:], None)
    y = skinny_mm(x, w, gate=None if head else aux, head_norm=hn, z=aux if head else None,
                  eps=1e-6 if head else None, config={"BN": bn, "BK": bk, "SPLIT_K": split})
    xd, ad = x.double().view(m, heads, g), aux.double()
    if head:
        op = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * hn.double() * torch.nn.functional.silu(ad)
    else:
        op = xd * torch.sigmoid(ad)
    op = op.reshape(m, k)
    want, scale = op @ w.double().T, op.abs() @ w.double().abs().T
    assert ((y.double() - want).abs() <= 1e-5 * scale + 1e-6).all()


def test_fused_writes_nothing_outside_y_and_the_sum():
    """Guards around y and sum_out, K and N both leaving partial tiles, K split."""
    gen = torch.Generator().manual_seed(4)
    m, k, n = 3, 150, 21
    x, res, nw, w = rand(gen, m, k), rand(gen, m, k), rand(gen, k), rand(gen, 2 * n, k)
    ybox, sbox = torch.full((m * n + 64,), 7.0), torch.full((m * k + 64,), 7.0)
    out, total = ybox[32:32 + m * n].view(m, n), sbox[32:32 + m * k].view(m, k)
    skinny_mm(x, w, out=out, residual=res, norm=nw, eps=1e-6, sum_out=total, glu=True,
              config={"BN": 16, "BK": 64, "SPLIT_K": 2})
    _, want, err = fused_reference(x, w, res, nw, 1e-6, True)
    assert ((out.double() - want).abs() <= err).all() and torch.equal(total, x + res)
    for box in (ybox, sbox):
        assert (box[:32] == 7).all() and (box[-32:] == 7).all()


def test_the_sum_is_written_when_there_are_no_columns():
    """A projection of no columns still writes the residual stream's sum (one block does)."""
    gen = torch.Generator().manual_seed(5)
    x, res, nw = rand(gen, 2, 40), rand(gen, 2, 40), rand(gen, 40)
    total = torch.zeros(2, 40)
    y = skinny_mm(x, torch.zeros(0, 40), residual=res, norm=nw, eps=1e-6, sum_out=total)
    assert y.shape == (2, 0) and torch.equal(total, x + res)


def test_default_rule_strided_rows_and_out():
    """x a column slice of a wider activation (rows strided), y written into a row-strided
    view; the default rule splits K for a small output."""
    gen = torch.Generator().manual_seed(1)
    wide = rand(gen, 5, 3000)
    x = wide[:, 100:2148]
    w = rand(gen, 48, 2048)
    assert rule(5, 48, 2048)["SPLIT_K"] > 1
    box = torch.full((5, 80), 7.0)
    out = box[:, 10:58]
    assert skinny_mm(x, w, out=out) is out
    assert_product(out, x, w)
    assert (box[:, :10] == 7).all() and (box[:, 58:] == 7).all()


def test_writes_nothing_outside_y():
    """A guard on both sides of y (rows past M, columns past N of the padded tiles)."""
    gen = torch.Generator().manual_seed(2)
    x, w = rand(gen, 3, 200), rand(gen, 21, 200)
    box = torch.full((3 * 21 + 64,), 7.0)
    out = box[32:32 + 63].view(3, 21)
    skinny_mm(x, w, out=out, config={"BN": 16, "BK": 64, "SPLIT_K": 2})
    assert_product(out, x, w)
    assert (box[:32] == 7).all() and (box[-1:] == 7).all()


def test_the_rule_fills_the_gpu():
    """Two programs an SM at least, where K allows the split; 32 columns a program (R-12's
    grid: 16 never the best at a 9B shape); 9B's shapes at R-12's best or within 2% of it."""
    for n, k in ((12352, 4096), (4096, 12288), (24576, 4096), (4096, 4096), (248320, 4096), (64, 64)):
        cfg = rule(1, n, k)
        programs = -(-n // cfg["BN"]) * cfg["SPLIT_K"]
        assert programs >= 2 * 132 or k // cfg["SPLIT_K"] < 2048, (n, k, cfg)
        assert cfg["BN"] == 32
    assert [rule(1, n, k)["SPLIT_K"] for n, k in ((4096, 4096), (4096, 12288), (12352, 4096))] == [4, 4, 1]


@pytest.mark.parametrize("kwargs,field", [
    (dict(x=torch.zeros(SKINNY_MM_MAX_ROWS + 1, 8), w=torch.zeros(4, 8)), "x"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 9)), "w"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8, dtype=torch.float64)), "w"),
    (dict(x=torch.zeros(8, 2).t(), w=torch.zeros(4, 8)), "x"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), out=torch.zeros(2, 5)), "out"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), config={"BN": 8}), "config"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), config={"SPLIT": 2}), "config"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(5, 8), glu=True), "w"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), norm=torch.zeros(7), eps=1e-6), "norm"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), norm=torch.zeros(8)), "eps"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), residual=torch.zeros(2, 8), norm=torch.zeros(8), eps=1e-6),
     "sum_out"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), residual=torch.zeros(2, 8), sum_out=torch.zeros(2, 8)),
     "residual"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), sum_out=torch.zeros(2, 8)), "sum_out"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), residual=torch.zeros(2, 9), norm=torch.zeros(8), eps=1e-6,
          sum_out=torch.zeros(2, 8)), "residual"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), gate=torch.zeros(2, 3, 4)), "gate"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), head_norm=torch.zeros(3), z=torch.zeros(2, 2, 3), eps=1e-6),
     "head_norm"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), head_norm=torch.zeros(4), eps=1e-6), "z"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), head_norm=torch.zeros(4), z=torch.zeros(2, 2, 4)), "eps"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), head_norm=torch.zeros(4), z=torch.zeros(2, 4, 2), eps=1e-6),
     "z"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), z=torch.zeros(2, 2, 4)), "z"),
    (dict(x=torch.zeros(2, 8), w=torch.zeros(4, 8), gate=torch.zeros(2, 2, 4), norm=torch.zeros(8), eps=1e-6),
     "one operand"),
    (dict(x=torch.zeros(2, 8, dtype=torch.float16), w=torch.zeros(4, 8, dtype=torch.float16),
          norm=torch.zeros(8, dtype=torch.float16), eps=1e-6), "float16"),
])
def test_bad_inputs_are_named(kwargs, field):
    with pytest.raises(InputError, match=field):
        skinny_mm(**kwargs)


def test_outputs_over_their_own_inputs_are_refused():
    """sum_out or out written in place over x, residual or each other would race with the
    programs reading them."""
    x, res, nw, w = torch.zeros(2, 8), torch.zeros(2, 8), torch.zeros(8), torch.zeros(8, 8)
    for total, name in ((x, "x"), (res[:, :], "residual")):
        with pytest.raises(InputError, match=f"sum_out: overlaps {name}"):
            skinny_mm(x, w, residual=res, norm=nw, eps=1e-6, sum_out=total)
    total = torch.zeros(2, 8)
    for out, name in ((x, "x"), (res, "residual"), (total, "sum_out"), (w[:2], "w")):
        with pytest.raises(InputError, match=f"out: overlaps {name}"):
            skinny_mm(x, w, out=out, residual=res, norm=nw, eps=1e-6, sum_out=total)
    gates = torch.zeros(2, 2, 4)  # the operand's gate [M, H, G], read while out is written
    with pytest.raises(InputError, match="out: overlaps gate"):
        skinny_mm(x, w, gate=gates, out=gates.view(2, 8))
    z = torch.zeros(2, 2, 4)
    with pytest.raises(InputError, match="out: overlaps z"):
        skinny_mm(x, w, head_norm=torch.ones(4), z=z, eps=1e-6, out=z.view(2, 8))
    with pytest.raises(InputError, match="out: its elements overlap"):
        skinny_mm(x, w, out=torch.zeros(1, 8).expand(2, 8))


@pytest.mark.gpu
def test_bf16_decode_shapes_against_cublas():
    """bf16 at the 9B decode shapes, rows 1-64, default rule: within bf16's rounding of
    cuBLAS (both accumulate in float32; the order differs)."""
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(3)
    for n, k in ((12352, 4096), (4096, 12288), (4096, 4096), (24576, 4096)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        for m in (1, 4, 16, 33, 64):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            got, want = skinny_mm(x, w).float(), F.linear(x, w).float()
            rel = (got - want).norm() / want.norm()
            assert rel < 4e-3, (n, k, m, float(rel))


@pytest.mark.gpu
def test_bf16_fused_decode_shapes_against_the_unfused_step():
    """bf16, the 9B decode's gate_up and in_proj with the residual add and RMSNorm fused
    before them (and SwiGLU after gate_up): within bf16's rounding of add_rms + cuBLAS (+
    SwiGLU), the sum bitwise."""
    import torch.nn.functional as F

    from bole_cli.runtime.fusion import RMS_EPS, add_rms, swiglu

    gen = torch.Generator(device="cuda").manual_seed(6)
    kw = dict(device="cuda", dtype=torch.bfloat16, generator=gen)
    for n, k, glu in ((24576, 4096, True), (12352, 4096, False), (248320, 4096, False)):
        w = torch.randn(n, k, **kw) / k ** 0.5
        for m in (1, 4, 16, 64):
            x, res, nw = torch.randn(m, k, **kw), torch.randn(m, k, **kw), 1 + torch.randn(k, **kw) / 8
            total = torch.empty_like(x)
            got = skinny_mm(x, w, residual=res, norm=nw, eps=RMS_EPS, sum_out=total, glu=glu).float()
            s, h = add_rms(x, res, nw)
            want = F.linear(h, w)
            want = (swiglu(want) if glu else want).float()
            rel = (got - want).norm() / want.norm()
            assert rel < 8e-3 and torch.equal(total, s), (n, k, m, glu, float(rel))


@pytest.mark.gpu
def test_bf16_per_head_operands_against_the_unfused_step():
    """bf16, the 9B out_proj with the GDN output's gated per-head norm fused, and o_proj with
    the attention gate fused: within bf16's rounding of the compiled pieces + cuBLAS."""
    import torch.nn.functional as F

    from bole_cli.runtime.fusion import RMS_EPS, gated_norm, gated_out

    gen = torch.Generator(device="cuda").manual_seed(7)
    kw = dict(device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(4096, 4096, **kw) / 64
    for m in (1, 16, 33, 64):
        o = torch.randn(m, 32, 128, **kw)
        z, hn = torch.randn(m, 32, 128, **kw), 1 + torch.randn(128, **kw) / 8
        got = skinny_mm(o.view(m, -1), w, head_norm=hn, z=z, eps=RMS_EPS).float()
        want = F.linear(gated_norm(o, z.view(m, -1), hn, torch.float32), w).float()
        assert (got - want).norm() / want.norm() < 8e-3, ("head", m)
        a, gate = torch.randn(m, 16, 256, **kw), torch.randn(m, 16, 512, **kw)[..., 256:]
        got = skinny_mm(a.view(m, -1), w, gate=gate).float()
        want = F.linear(gated_out(a, gate), w).float()
        assert (got - want).norm() / want.norm() < 8e-3, ("gate", m)
