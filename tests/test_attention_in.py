"""kernels.attention_in against its float64 reference (kernels/reference.py): random heads,
GQA ratios 1/2/4, head sizes that are and are not powers of two, no / partial / full
rotation, strided rows, caches written only where each row points and never outside them,
and the runtime's unfused pieces (fusion.attn_in and the index writes) it replaces.

CPU: Triton's interpreter in float32 (the reference's float64 at float32 tolerance); GPU:
bf16 against the compiled pieces.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bole_cli.errors import InputError
from bole_cli.kernels import attention_in
from bole_cli.kernels.reference_attention import attention_in_ref

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
EPS = 1e-6


def inputs(gen, n, heads, kv, d, half, slots=3, length=9, dtype=torch.float32, pad=0):
    width = (2 * heads + 2 * kv) * d
    proj = (torch.randn(n, width + pad, generator=gen) * 3)[:, pad // 2: pad // 2 + width].to(dtype)
    qn, kn = 1 + torch.randn(d, generator=gen) / 4, 1 + torch.randn(d, generator=gen) / 4
    ang = torch.rand(n, half, generator=gen) * 6
    cache = [torch.randn(slots, kv, length, d, generator=gen).to(dtype) for _ in range(2)]
    p = torch.randperm(slots * length, generator=gen)[:n]  # distinct (slot, position) pairs
    return proj, qn.to(dtype), kn.to(dtype), ang.cos(), ang.sin(), cache, p // length, p % length


@SETTINGS
@given(n=st.integers(0, 12), kv=st.sampled_from([1, 2, 3]), group=st.sampled_from([1, 2, 4]),
       d=st.sampled_from([4, 16, 24, 64]), rot=st.sampled_from([0.0, 0.25, 0.5]), k_out=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_matches_the_float64_reference(n, kv, group, d, rot, k_out, seed):
    gen = torch.Generator().manual_seed(seed)
    half = int(d * rot)
    proj, qn, kn, cos, sin, (kc, vc), slots, pos = inputs(gen, n, kv * group, kv, d, half, pad=6)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    q, gate, k, v = attention_in(proj, qn, kn, cos, sin, kc, vc, slots, pos, heads=kv * group, kv_heads=kv,
                                 eps=EPS, k_out=k_out)
    rq, rgate, rk, rv = attention_in_ref(proj, qn, kn, cos, sin, kc_ref, vc_ref, slots, pos, heads=kv * group,
                                         kv_heads=kv, eps=EPS, k_out=k_out)
    torch.testing.assert_close(q.double(), rq, rtol=1e-5, atol=1e-5)
    assert torch.equal(gate, rgate) and torch.equal(v, rv) and (k is None) == (not k_out)
    if k_out:
        torch.testing.assert_close(k.double(), rk, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc, kc_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(vc, vc_ref)  # copied, not computed


def test_rows_outside_the_cache_write_nothing_there():
    """Slots and positions past either end (a guard around each cache): those rows' keys and
    values are dropped, their q and k still come back, the other rows land where they point."""
    gen = torch.Generator().manual_seed(1)
    proj, qn, kn, cos, sin, (kc, vc), slots, pos = inputs(gen, 6, 4, 2, 16, 4)
    slots = torch.tensor([0, -1, 3, 1, 2, 0])
    pos = torch.tensor([0, 2, 1, -1, 9, 8])
    boxes = [torch.full((kc.numel() + 2 * 1024,), 7.0) for _ in range(2)]
    kb, vb = (b[1024:1024 + kc.numel()].view(kc.shape) for b in boxes)
    kb.copy_(kc), vb.copy_(vc)
    q, _, k, _ = attention_in(proj, qn, kn, cos, sin, kb, vb, slots, pos, heads=4, kv_heads=2, eps=EPS, k_out=True)
    rq, _, rk, _ = attention_in_ref(proj, qn, kn, cos, sin, kc, vc, slots, pos, heads=4, kv_heads=2, eps=EPS,
                                    k_out=True)
    for b in boxes:
        assert (b[:1024] == 7).all() and (b[-1024:] == 7).all()
    torch.testing.assert_close(kb, kc, rtol=1e-5, atol=1e-5)
    assert torch.equal(vb, vc)
    torch.testing.assert_close(q.double(), rq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k.double(), rk, rtol=1e-5, atol=1e-5)


def test_the_runtime_pieces_it_replaces():
    """fusion.attn_in then the cache's index writes (the unfused step): the same q, gate, k, v
    and caches."""
    from bole_cli.runtime.fusion import RMS_EPS, attn_in

    gen = torch.Generator().manual_seed(2)
    heads, kv, d, half = 8, 2, 32, 8
    proj, qn, kn, cos, sin, (kc, vc), slots, pos = inputs(gen, 5, heads, kv, d, half)
    kc2, vc2 = kc.clone(), vc.clone()
    q, gate, k, v = attention_in(proj, qn, kn, cos, sin, kc, vc, slots, pos, heads=heads, kv_heads=kv,
                                 eps=RMS_EPS, k_out=True)
    wq, wgate, wk, wv = attn_in(proj, qn, kn, cos, sin, heads, kv, d)
    kc2[slots, :, pos], vc2[slots, :, pos] = wk, wv
    torch.testing.assert_close(q, wq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, wk, rtol=1e-5, atol=1e-5)
    assert torch.equal(gate.reshape(5, -1), wgate.reshape(5, -1)) and torch.equal(v, wv)
    torch.testing.assert_close(kc, kc2, rtol=1e-5, atol=1e-5)
    assert torch.equal(vc, vc2)


@pytest.mark.parametrize("change,field", [
    (dict(proj=torch.zeros(2, 99)), "proj"),
    (dict(heads=3), "heads"),
    (dict(q_norm=torch.zeros(15)), "q_norm"),
    (dict(cos=torch.zeros(2, 9), sin=torch.zeros(2, 9)), "cos"),
    (dict(sin=torch.zeros(3, 4)), "sin"),
    (dict(slots=torch.zeros(3, dtype=torch.int64)), "slots"),
    (dict(positions=torch.zeros(2)), "positions"),
    (dict(v_cache=torch.zeros(3, 2, 8, 8)), "v_cache"),
    (dict(eps=-1.0), "eps"),
])
def test_bad_inputs_are_named(change, field):
    kw = dict(proj=torch.zeros(2, (2 * 4 + 2 * 2) * 16), q_norm=torch.ones(16), k_norm=torch.ones(16),
              cos=torch.ones(2, 4), sin=torch.zeros(2, 4), k_cache=torch.zeros(3, 2, 8, 16),
              v_cache=torch.zeros(3, 2, 8, 16), slots=torch.zeros(2, dtype=torch.int64),
              positions=torch.zeros(2, dtype=torch.int64), heads=4, kv_heads=2, eps=EPS)
    kw.update(change)
    with pytest.raises(InputError, match=field):
        attention_in(**kw)


@pytest.mark.gpu
def test_bf16_against_the_compiled_pieces():
    """bf16 at the 9B attention shape (16 query heads, 4 kv heads, head 256, a quarter
    rotated), decode and verify row counts: within a bf16 ulp or two of the compiled attn_in."""
    from bole_cli.runtime.fusion import RMS_EPS, Fusion

    fuse = Fusion(compile=True)
    gen = torch.Generator().manual_seed(3)
    for n in (1, 16, 64):
        proj, qn, kn, cos, sin, (kc, vc), slots, pos = (
            t.cuda() if isinstance(t, torch.Tensor) else [c.cuda() for c in t]
            for t in inputs(gen, n, 16, 4, 256, 32, slots=64, length=64, dtype=torch.bfloat16))
        q, gate, k, v = attention_in(proj, qn, kn, cos, sin, kc, vc, slots, pos, heads=16, kv_heads=4,
                                     eps=RMS_EPS, k_out=True)
        wq, _, wk, _ = fuse.attn_in(proj, qn, kn, cos, sin, 16, 4, 256)
        for got, want in ((q, wq), (k, wk), (kc[slots, :, pos], wk)):
            assert ((got.float() - want.float()).abs() <= 2e-2 * want.float().abs() + 2e-2).all(), n
