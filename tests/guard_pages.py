"""Tensors flush against a page the process may not touch (PROT_NONE), for the kernels' bounds
under Triton's CPU interpreter, which reads and writes through raw pointers: any access
outside an argument, even one whose value never reaches an output (a read for a request that
then stores nothing), ends the process with SIGSEGV. Run as a script, in a subprocess, so a
fault fails the calling test and not pytest:

    TRITON_INTERPRET=1 python tests/guard_pages.py   # prints one line a case, then "all cases ran"

Linux (or any POSIX libc with mprotect) only.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

import torch

PAGE = mmap.PAGESIZE
_KEEP: list = []  # the mappings behind the tensors: alive as long as the process


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def guarded(t: torch.Tensor, side: str) -> torch.Tensor:
    """A contiguous copy of t whose first byte ("before") or last byte ("after") touches a
    PROT_NONE page."""
    t = t.contiguous()
    nbytes = t.numel() * t.element_size()
    pages = -(-nbytes // PAGE) + 1
    mm = mmap.mmap(-1, (pages + 1) * PAGE)
    _KEEP.append(mm)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    if side == "after":
        offset, guard = pages * PAGE - nbytes, base + pages * PAGE
    else:
        offset, guard = PAGE, base
    out = torch.frombuffer(mm, dtype=t.dtype, count=t.numel(), offset=offset).view(t.shape)
    out.copy_(t)
    if _libc().mprotect(guard, PAGE, 0) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")
    return out


def garbage_offsets(n: int, first: int) -> list:
    """(name, cu_seqlens) of two requests over n nodes, the first of `first`, that no forest of
    the contract has (what a kernel may meet without checks, under CUDA graphs)."""
    return [("empty-last", [0, n, n]),  # the second request is empty (and may claim a node)
            ("past-n", [0, first, n + 40]), ("below-0", [-40, first, n]), ("huge", [2**40, -2**40, 2**41])]


def guards(label: str):
    """For each side of the arguments, the case printed (the last line before a fault names
    it) and the function that guards a tensor on that side."""
    for side in ("after", "before"):
        print(f"{label} {side}", flush=True)
        yield lambda t, side=side: guarded(t, side)


def run_commit_cases() -> None:
    """Both commits; a 70-node path takes the replay's passes kernel."""
    from test_kernels import args, make_case

    from bole_cli.kernels import tree_commit, tree_commit_replay, tree_verify

    for sizes in ([9, 12], [70, 9], [9, 70]):
        case, _ = make_case(7, sizes, h=1, group=2, kdim=16, vdim=16, decay=(-0.5, -0.01), shape="chain",
                            slots_extra=2)
        res = tree_verify(*args(case))
        commits = {"tree_commit": (tree_commit, [case["k"], res.u, res.log_p]),
                   "replay": (tree_commit_replay, [case[x] for x in ("k", "v", "g", "beta")])}
        for name, cu in garbage_offsets(sum(sizes), sizes[0]):
            acc = torch.tensor([sizes[0] - 1, 0 if name == "empty-last" else sizes[1] - 1], dtype=torch.int32)
            for kernel, (commit, rows) in commits.items():
                for g in guards(f"{kernel} {sizes} {name}"):
                    commit(g(case["state"]), g(case["state_indices"]), *[g(r) for r in rows], g(case["parents"]),
                           g(torch.tensor(cu)), g(acc), check_trees=False)


# (name, sizes, the verify's promises): each route of the verify (tests/test_kernels.py's routes)
VERIFY_ROUTES = [
    ("tile", [9, 12], {"max_nodes": 64}),
    ("blocked", [70, 9], {"max_depth": 69, "config": {"SPLIT": 0, "LEVELS": 0}}),
    ("split", [70, 9], {"max_depth": 69, "config": {"SPLIT": 1, "LEVELS": 0}}),
    ("levels", [70, 9], {"max_depth": 8}),
    ("chain", [100, 9], {}),
]


def run_verify_and_conv_cases() -> None:
    """The verify on every route and both conv kernels under the same offsets, outputs guarded too."""
    from test_kernels import args, make_case, poisoned_out

    from bole_cli.kernels import VerifyResult, tree_conv, tree_conv_commit, tree_verify

    for route, sizes, call in VERIFY_ROUTES:
        case, _ = make_case(7, sizes, h=1, group=2, kdim=16, vdim=16, decay=(-0.5, -0.01),
                            shape="chain" if route in ("chain", "blocked", "split") else "any", slots_extra=2)
        for name, cu in garbage_offsets(sum(sizes), sizes[0]):
            bad = dict(case, cu_seqlens=torch.tensor(cu))
            for g in guards(f"verify {route} {name}"):
                tree_verify(*[g(t) for t in args(bad)], check_trees=False,
                            out=VerifyResult(*(g(t) for t in poisoned_out(case))), **call)
            if route != "tile":
                continue
            for g in guards(f"tree_conv and tree_conv_commit {name}"):
                x = g(case["v"][:, 0, :])
                pool = g(torch.randn(5, 16, 3))
                tree_conv(x, pool, g(torch.randn(16, 4)), g(torch.randn(16)), g(case["state_indices"]),
                          g(case["parents"]), g(bad["cu_seqlens"]), check_trees=False, out=g(torch.empty_like(x)))
                tree_conv_commit(pool, x, g(case["state_indices"]), g(case["parents"]), g(bad["cu_seqlens"]),
                                 g(torch.tensor([3, 0], dtype=torch.int32)), check_trees=False)


def run_plugin_cases() -> None:
    """The plug-in's conv-window commit and slot seeding under the same offsets and slots past
    the pool on either side."""
    from bole_cli.kernels.conv_window_commit import conv_window_commit
    from bole_cli.kernels.seed_slots import seed_slots

    sizes, layers, dim, w1, slots = [9, 12], 2, 8, 3, 4
    n = sum(sizes)
    parents = torch.tensor(list(range(-1, 8)) + list(range(-1, 11)), dtype=torch.int32)
    for name, cu in garbage_offsets(n, sizes[0]):
        for dst in ([0, 3], [slots, -1], [2**40, -2**40]):
            for g in guards(f"conv_window_commit {name} dst={dst}"):
                conv_window_commit(g(torch.randn(layers, slots, dim, w1)), g(torch.randn(layers, n, dim)),
                                   g(torch.randn(layers, 2, dim, w1)), g(torch.tensor(dst)), g(parents),
                                   g(torch.tensor(cu)), g(torch.tensor([8, 11], dtype=torch.int32)))
    for src, dst in (([0, slots], [1, -1]), ([2**40, 1], [-2**40, 2]), ([-1, 3], [slots + 7, 0])):
        for g in guards(f"seed_slots src={src} dst={dst}"):
            seed_slots(g(torch.randn(layers, slots, 3, 5)), g(torch.tensor(src)), g(torch.tensor(dst)),
                       g(torch.tensor([0, 2], dtype=torch.int32)))


def run_draft_topk_cases() -> None:
    """The drafter's top-k: vocabularies shorter than a chunk and not a whole number of chunks,
    k up to the vocabulary, the token map guarded too."""
    from bole_cli.kernels.draft_topk import CHUNK, draft_topk

    for n, vocab, k in ((1, 3, 3), (3, CHUNK + 5, 16), (2, 2 * CHUNK, 4)):
        for g in guards(f"draft_topk n={n} vocab={vocab} k={k}"):
            draft_topk(g(torch.randn(n, vocab)), k, token_map=g(torch.randperm(vocab)))


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))]
    run_commit_cases()
    run_verify_and_conv_cases()
    run_plugin_cases()
    run_draft_topk_cases()
    print("all cases ran", flush=True)
