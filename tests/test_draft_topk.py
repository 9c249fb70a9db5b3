"""kernels.draft_topk against its float64 reference (a stable descending sort): random
rows of one to several chunks, k up to the limit, ties, -inf and NaN logits, strided rows,
16-bit logits, the hot-token map; bad arguments refused by name. The drafter takes it in
place of torch.topk and drafts the same tokens (bench/drafter.py).

CPU: Triton's interpreter; GPU: 248k and 32k vocabularies of bf16 logits (ties common), 1-256
rows, k 1, 5 and 16.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bole_cli.errors import InputError
from bole_cli.kernels.draft_topk import CHUNK, draft_topk
from bole_cli.kernels.reference import draft_topk_ref
from bole_cli.limits import DRAFT_TOPK_MAX_K

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def logits_for(gen, n, vocab, kind, dtype=torch.float32, pad=0):
    """n rows of vocab logits in dtype, a view into rows pad wider when pad (rows apart by
    vocab + pad, not vocab): 'normal', 'ties' (a few distinct values), 'extremes' (-inf,
    +inf and NaN among normal values)."""
    x = torch.randn(n, vocab, generator=gen)
    if kind == "ties":
        x = torch.randint(0, 3, x.shape, generator=gen).float()
    elif kind == "extremes":
        pick = torch.rand(x.shape, generator=gen)
        x = torch.where(pick < 0.3, -torch.inf, x)
        x = torch.where(pick > 0.995, torch.inf, x)
        x = torch.where((pick > 0.99) & (pick <= 0.995), torch.nan, x)
    wide = torch.full((n, vocab + pad), 1e4).to(dtype)  # the padding outranks every logit if read
    wide[:, pad // 2: pad // 2 + vocab] = x.to(dtype)
    return wide[:, pad // 2: pad // 2 + vocab]


@SETTINGS
@given(n=st.integers(1, 4), vocab=st.sampled_from([1, 2, 5, 100, CHUNK - 1, CHUNK, CHUNK + 3, 2 * CHUNK + 17]),
       k=st.integers(1, DRAFT_TOPK_MAX_K), kind=st.sampled_from(["normal", "ties", "extremes"]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       mapped=st.sampled_from([None, torch.int32, torch.int64]), pad=st.sampled_from([0, 6]),
       seed=st.integers(0, 2 ** 16))
def test_matches_the_float64_reference(n, vocab, k, kind, dtype, mapped, pad, seed):
    k = min(k, vocab)
    gen = torch.Generator().manual_seed(seed)
    x = logits_for(gen, n, vocab, kind, dtype, pad)
    assert x.stride(0) == vocab + pad
    token_map = None if mapped is None else torch.randperm(5 * vocab, generator=gen)[:vocab].to(mapped)
    got = draft_topk(x, k, token_map=token_map)
    assert got.dtype == torch.int64 and got.shape == (n, k)
    assert torch.equal(got, draft_topk_ref(x, k, token_map))


@pytest.mark.parametrize("n, vocab, k, pad", [(3, 2 * CHUNK + 17, 16, 40), (2, CHUNK + 3, 5, 8), (4, 100, 1, 1)])
def test_rows_apart_by_more_than_the_vocabulary(n, vocab, k, pad):
    """Each row read at its own stride (a view into wider rows whose padding outranks every
    logit): the padding is never drafted."""
    x = logits_for(torch.Generator().manual_seed(vocab), n, vocab, "normal", pad=pad)
    got = draft_topk(x, k)
    assert torch.equal(got, draft_topk_ref(x, k)) and int(got.max()) < vocab


def test_no_rows_no_launch():
    assert draft_topk(torch.empty(0, 50), 3).shape == (0, 3)


def test_a_row_of_equal_logits_takes_the_lowest_ids_across_chunks():
    """Every logit equal: the first k ids, though the candidates come from several chunks."""
    x = torch.zeros(2, 3 * CHUNK)
    assert torch.equal(draft_topk(x, 5), torch.arange(5).expand(2, 5))
    x[1, 2 * CHUNK + 1] = 1.0  # one larger value in the last chunk leads
    assert draft_topk(x, 3)[1].tolist() == [2 * CHUNK + 1, 0, 1]


def test_the_drafter_drafts_the_same_tokens_with_either_top_k():
    """MTPDrafter's level with the kernel and with torch.topk: the same ids, full vocabulary
    and a hot-token head (random float32 logits have no ties)."""
    from bole_cli.bench.drafter import MTPDrafter, build_layout
    from bole_cli.runtime.model import HybridModel
    from bole_cli.runtime import tiny_spec

    model = HybridModel(tiny_spec(), device="cpu", dtype=torch.float32, seed=3)
    layout = build_layout(3, 2, [[0.6, 0.3]] * 3)
    for vocab in (None, 40):
        drafts = []
        for kernel in (True, False):
            drafter = MTPDrafter(model, layout, draft_vocab=vocab, topk_kernel=kernel)
            assert drafter.topk_kernel is kernel
            st_ = drafter.new_state(2, 8)
            st_.pending.copy_(torch.tensor([3, 5]))
            drafts.append(drafter.forward(st_))
        assert torch.equal(drafts[0], drafts[1])
    assert MTPDrafter(model, layout).topk_kernel is False  # CPU: torch.topk by default
    with pytest.raises(InputError, match="topk_kernel: the kernel ranks 1..16"):
        MTPDrafter(model, build_layout(1, DRAFT_TOPK_MAX_K + 1, [[0.5] * 17]), topk_kernel=True)


@pytest.mark.parametrize("call, match", [
    (lambda: draft_topk(torch.randn(2, 8), 0), "k: expected 1..8"),
    (lambda: draft_topk(torch.randn(2, 8), 9), "k: expected 1..8"),
    (lambda: draft_topk(torch.randn(2, 100), DRAFT_TOPK_MAX_K + 1), "DRAFT_TOPK_MAX_K"),
    (lambda: draft_topk(torch.randn(8, 2).t(), 1), "logits: the last dimension must be contiguous"),
    (lambda: draft_topk(torch.randn(8), 1), "logits: expected 2 dimensions"),
    (lambda: draft_topk(torch.randn(2, 8).long(), 1), "logits: dtype int64"),
    (lambda: draft_topk(torch.randn(2, 8), 2, token_map=torch.arange(7)), r"token_map: expected shape \(8,\)"),
    (lambda: draft_topk(torch.randn(2, 8), 2, token_map=torch.arange(8.0)), "token_map: dtype float32"),
])
def test_bad_arguments_are_refused_by_name(call, match):
    with pytest.raises(InputError, match=match):
        call()


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 5, 16])
@pytest.mark.parametrize("rows", [1, 4, 64, 256])
@pytest.mark.parametrize("vocab", [248320, 32768])
def test_gpu_bf16_logits_of_a_real_vocabulary(rows, vocab, k):
    """bf16 logits (many ties at this width) as the drafter's LM head writes them: the
    reference's ids exactly, and torch.topk's values."""
    gen = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, vocab, generator=gen, device="cuda").to(torch.bfloat16)
    token_map = torch.randperm(vocab, device="cuda")
    got = draft_topk(x, k, token_map=token_map)
    assert torch.equal(got, draft_topk_ref(x, k, token_map))
    plain = draft_topk(x, k)
    assert torch.equal(x.gather(1, plain), torch.topk(x, k).values)
