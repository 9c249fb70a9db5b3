"""Split-key attention to the KV cache (kernels/cache_attention.py) against its float64
reference: any lengths (none, short, past the cache), several key chunks merged, GQA rows,
slots outside the pool. CPU: Triton's interpreter, float32."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bole_cli.errors import InputError
from bole_cli.kernels.cache_attention import attention_splits, cache_attention
from bole_cli.kernels.reference import cache_attention_ref

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def case(seed, bsz, hkv, rows, d, lmax, lengths, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(bsz, hkv, rows, d, generator=g).to(dtype)
    k = torch.randn(bsz + 2, hkv, lmax, d, generator=g).mul_(2.0).to(dtype)  # sharp softmax: max matters
    v = torch.randn(bsz + 2, hkv, lmax, d, generator=g).to(dtype)
    slots = torch.randperm(bsz + 2, generator=g)[:bsz]
    return q, k, v, slots, torch.tensor(lengths, dtype=torch.int32)


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), hkv=st.sampled_from([1, 2]), rows=st.sampled_from([1, 4, 17]),
       d=st.sampled_from([16, 32]), lengths=st.lists(st.integers(0, 700), min_size=1, max_size=3),
       bucket=st.sampled_from([None, 64]))
@example(seed=1, hkv=2, rows=4, d=32, lengths=[0, 513, 700], bucket=None)
def test_matches_float64_reference(seed, hkv, rows, d, lengths, bucket):
    lmax = 640
    q, k, v, slots, used = case(seed, len(lengths), hkv, rows, d, lmax, lengths)
    out, lse = cache_attention(q, k, v, slots, used, max_keys=None if bucket is None else max(lengths + [bucket]))
    want, want_lse = cache_attention_ref(q, k, v, slots, used)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


def test_several_chunks_are_merged():
    """Batch 1, one KV head, 600 keys: three chunks of the keys, merged."""
    assert attention_splits(1, 1, 1, 600) == 3
    q, k, v, slots, used = case(3, 1, 1, 4, 32, 640, [600])
    out, lse = cache_attention(q, k, v, slots, used)
    want, want_lse = cache_attention_ref(q, k, v, slots, used)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("keys", [100, 600])  # one chunk (normalised in place) or merged
def test_slot_outside_the_pool_is_nan(keys):
    q, k, v, slots, used = case(4, 2, 1, 4, 16, 640, [keys, keys])
    slots[1] = 99
    out, lse = cache_attention(q, k, v, slots, used)
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    assert torch.isfinite(out[0]).all() and torch.isfinite(lse[0]).all()


@pytest.mark.parametrize("change, message", [
    (dict(k=torch.zeros(3, 2, 8, 16)), "k_cache"),
    (dict(slots=torch.zeros(3, dtype=torch.int64)), "slots"),
    (dict(used=torch.zeros(2)), "used"),
])
def test_bad_input_names_the_argument(change, message):
    q, k, v, slots, used = case(0, 2, 1, 4, 16, 64, [3, 4])
    args = dict(q=q, k=k, v=v, slots=slots, used=used) | change
    with pytest.raises(InputError, match=message):
        cache_attention(args["q"], args["k"], args["v"], args["slots"], args["used"])


@pytest.mark.gpu
@pytest.mark.parametrize("bsz, keys", [(1, 4096), (16, 1024), (4, 16384)])
def test_bf16_on_gpu(bsz, keys):
    q, k, v, slots, used = case(5, bsz, 4, 4, 256, keys, [keys - b for b in range(bsz)], dtype=torch.bfloat16)
    q, k, v, slots, used = (t.cuda() for t in (q, k, v, slots, used))
    out, lse = cache_attention(q, k, v, slots, used)
    want, want_lse = cache_attention_ref(q.cpu(), k.cpu(), v.cpu(), slots.cpu(), used.cpu())
    assert float((out.cpu().double() - want).norm() / want.norm()) < 1e-2
    torch.testing.assert_close(lse.cpu().double(), want_lse, atol=2e-2, rtol=1e-3)
