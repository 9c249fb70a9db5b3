"""kernels.tree_accept (a tree step's accepted paths in one launch) against a plain Python
walk over the same tables (against bench e2e's torch walk and the host walks on the bench's
own trees: tests/test_bench_e2e.py). On CPU the kernel runs under Triton's interpreter."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bole_cli.bench.drafter import build_layout
from bole_cli.bench.e2e import simulated_acceptance as e2e_acc
from bole_cli.bench.e2e import tree_budget as e2e_plan
from bole_cli.bench.e2e.device_walk import DeviceWalk, simulated_ranks
from bole_cli.errors import InputError
from bole_cli.kernels.tree_accept import tree_accept


def walk_ref(target, tokens, rows, children, start, depth, draws=None):
    """The walk in plain Python over lists: (accepted [B], out [B][depth + 2])."""
    n, n_layout, k = len(target), len(children), len(children[0]) if children else 0
    accepted, outs = [], []
    for b, table in enumerate(rows):
        out = [0] * (depth + 2)
        row = table[0]
        if not 0 <= row < n:
            accepted.append(-1)
            outs.append(out)
            continue
        node, alive, count = 0, True, 0
        for lvl in range(depth):
            kids = children[node]
            kid_rows = [table[c] if 0 <= c < n_layout else -1 for c in kids]
            kept = [0 <= c < n_layout and 0 <= r < n for c, r in zip(kids, kid_rows)]
            if draws is None:
                rank = next((r for r in range(k) if kept[r] and tokens[kid_rows[r]] == target[row]), -1)
            else:
                rank = draws[b][lvl]
            ok = alive and 0 <= rank < k and kept[rank]
            if ok:
                node, row = kids[rank], kid_rows[rank]
            out[lvl + 1] = tokens[row]
            count += ok
            alive = ok
        out[count + 1] = target[row]
        out[0] = count + 1
        accepted.append(row - start[b])
        outs.append(out)
    return accepted, outs


def random_tables(rng: random.Random, batch: int, n_layout: int, k: int, keep: float, chain: bool = False):
    """A random tree layout of n_layout nodes (children by rank, holes allowed) and, per
    request, a random kept subset (the root always), packed request after request."""
    children = [[-1] * k for _ in range(n_layout)]
    for i in range(1, n_layout):
        if chain:
            children[i - 1][0] = i
            continue
        free = [(p, r) for p in range(i) for r in range(k) if children[p][r] < 0]
        if not free:
            break
        p, r = rng.choice(free)
        children[p][r] = i
    rows, start, packed = [], [], 0
    for _ in range(batch):
        start.append(packed)
        table = [-1] * n_layout
        table[0] = packed
        packed += 1
        for i in range(1, n_layout):
            if rng.random() < keep:
                table[i] = packed
                packed += 1
        rows.append(table)
    return rows, children, start, packed


def int64s(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int64, device=device)


def _run(target, tokens, rows, children, start, depth, draws=None, steps=1, step=0, device="cpu",
         accepted=None, out=None):
    """tree_accept on lists (a ranked walk: `draws` repeated for `steps` steps), as lists."""
    tables = (int64s(x, device) for x in (target, tokens, rows, children, start))
    acc, out = tree_accept(*tables, depth=depth, ranks=None if draws is None else int64s([draws] * steps, device),
                           step=None if draws is None else int64s([step], device), accepted=accepted, out=out)
    return acc.tolist(), out.tolist()


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 5), n_layout=st.integers(1, 40), k=st.integers(1, 6), keep=st.floats(0.2, 1.0),
       vocab=st.integers(1, 3), depth=st.integers(0, 12), greedy=st.booleans(), seed=st.integers(0, 10**6))
def test_kernel_walks_as_the_python_walk(batch, n_layout, k, keep, vocab, depth, greedy, seed):
    """Random layouts with holes among the ranks, cut subsets, sibling token collisions (a
    vocabulary of 1-3: the first kept match by rank wins), ranks drawn past K and -1."""
    rng = random.Random(seed)
    rows, children, start, n = random_tables(rng, batch, n_layout, k, keep)
    target = [rng.randrange(vocab) for _ in range(n)]
    tokens = [rng.randrange(vocab) for _ in range(n)]
    draws = None if greedy else [[rng.randrange(-1, k + 2) for _ in range(depth)] for _ in range(batch)]
    assert _run(target, tokens, rows, children, start, depth, draws) == \
        walk_ref(target, tokens, rows, children, start, depth, draws)


def test_kernel_walks_a_256_node_chain_and_a_wide_tree():
    """A chain of 256 nodes, every token matching: the walk must reach the end (a walk that
    stopped early fails); then 255 children of one root, the match at the last rank."""
    n = 256
    rows, children, start, _ = random_tables(random.Random(0), 1, n, 1, 1.0, chain=True)
    target = list(range(n))
    tokens = [0] + list(range(n - 1))  # node i drafts i - 1, the target at its parent
    acc, out = _run(target, tokens, rows, children, start, n - 1)
    assert acc == [n - 1] and out[0][0] == n and out[0][1:n] == list(range(n - 1)) and out[0][n] == n - 1
    assert (acc, out) == walk_ref(target, tokens, rows, children, start, n - 1)
    wide = [list(range(1, n))] + [[-1] * (n - 1) for _ in range(n - 1)]
    tokens = [7] * (n - 1) + [0]
    acc, out = _run(target, tokens, [list(range(n))], wide, [0], 2)
    assert acc == [n - 1] and out == [[2, 0, 255, 0]]  # the draft, the bonus; the last column 0


def test_ranked_walk_reads_the_step_on_the_device():
    """Two steps of draws: the step tensor picks the row (and clamps past the table)."""
    rows, children, start, n = random_tables(random.Random(3), 2, 15, 2, 1.0)
    target, tokens = list(range(n)), list(range(100, 100 + n))
    draws = [[[0, 0, 0], [1, -1, 0]], [[-1, 0, 0], [0, 1, 1]]]
    for step in (0, 1, 5):
        tables = (int64s(x) for x in (target, tokens, rows, children, start))
        acc, out = tree_accept(*tables, depth=3, ranks=int64s(draws), step=int64s([step]))
        want = walk_ref(target, tokens, rows, children, start, 3, draws[min(step, 1)])
        assert (acc.tolist(), out.tolist()) == want


def garbage_tables(rng: random.Random, depth: int = 4):
    """Children and rows just past the layout and the nodes or below -1, roots outside the
    nodes, starts anywhere, ranks past K and below 0: (target, tokens, rows, children,
    start, draws, step) as lists."""
    batch, n_layout, k, n = rng.randint(1, 3), rng.randint(1, 6), rng.randint(1, 3), rng.randint(1, 8)
    rows = [[rng.randint(-2, n + 1) for _ in range(n_layout)] for _ in range(batch)]
    children = [[rng.randint(-2, n_layout + 1) for _ in range(k)] for _ in range(n_layout)]
    target, tokens = [rng.randrange(2) for _ in range(n)], [rng.randrange(2) for _ in range(n)]
    start = [rng.randint(0, n) for _ in range(batch)]
    draws = [[rng.randint(-1, k + 1) for _ in range(depth)] for _ in range(batch)]
    return target, tokens, rows, children, start, draws, rng.randint(-2, 2)


def test_kernel_stays_inside_its_arguments_whatever_the_tables_say():
    """Garbage tables (garbage_tables), every argument inside a larger buffer. The token
    buffers' guard entries are a value no output may hold; the index tables' are
    valid-looking indices (row 0, child 1, rank 0), so a read past a table changes the
    walk, which must stay the Python walk's. The outputs start as junk (a reused buffer)
    and their guard entries must come back untouched."""
    guard, depth = 987654321, 4

    def boxed(values, fill=guard):
        flat = torch.tensor(values, dtype=torch.int64)
        box = torch.full((flat.numel() + 64,), fill, dtype=torch.int64)
        box[32:32 + flat.numel()] = flat.view(-1)
        return box, box[32:32 + flat.numel()].view(flat.shape)

    rng = random.Random(5)
    for trial in range(150):
        target, tokens, rows, children, start, draws, step = garbage_tables(rng, depth)
        batch = len(rows)
        args = [boxed(target)[1], boxed(tokens)[1], boxed(rows, 0)[1], boxed(children, 1)[1], boxed(start)[1]]
        for greedy in (True, False):
            acc_box, acc = boxed([77] * batch)
            out_box, out = boxed([[77] * (depth + 2)] * batch)
            tree_accept(*args, depth=depth, ranks=None if greedy else boxed([draws], 0)[1],
                        step=None if greedy else boxed([step], 0)[1], accepted=acc, out=out)
            for box in (acc_box, out_box):
                assert (box[:32] == guard).all() and (box[-32:] == guard).all(), (trial, greedy)
            want = walk_ref(target, tokens, rows, children, start, depth, None if greedy else draws)
            assert (acc.tolist(), out.tolist()) == want, (trial, greedy)


@pytest.mark.gpu
def test_kernel_on_garbage_tables_on_the_gpu():
    """The garbage tables on the GPU, each argument its own exact-size tensor, outputs
    reused: the walk must be the Python walk's. Run under compute-sanitizer's memcheck with
    PyTorch's caching allocator off (experiments/owed_h200.sh sanitize), any read or write
    past an argument is reported, including reads whose value the walk never uses."""
    dev, depth = torch.device("cuda"), 4
    rng = random.Random(11)
    for trial in range(60):
        target, tokens, rows, children, start, draws, step = garbage_tables(rng, depth)
        acc = torch.full((len(rows),), 77, dtype=torch.int64, device=dev)
        out = torch.full((len(rows), depth + 2), 77, dtype=torch.int64, device=dev)
        for greedy in (True, False):
            draws_or_none = None if greedy else draws
            got = _run(target, tokens, rows, children, start, depth, draws_or_none, step=step, device=dev,
                       accepted=acc, out=out)
            assert got == walk_ref(target, tokens, rows, children, start, depth, draws_or_none), (trial, greedy)


def test_tree_accept_names_the_bad_argument():
    args = (int64s([0, 1]), int64s([0, 1]), int64s([[0, 1]]), int64s([[1], [-1]]), int64s([0]))
    acc, out = tree_accept(*args, depth=1)
    assert (acc.tolist(), out.tolist()) == walk_ref([0, 1], [0, 1], [[0, 1]], [[1], [-1]], [0], 1)
    with pytest.raises(InputError, match="tokens"):
        tree_accept(args[0], int64s([0]), *args[2:], depth=1)
    with pytest.raises(InputError, match="children"):
        tree_accept(*args[:3], int64s([[1]]), args[4], depth=1)
    with pytest.raises(InputError, match="depth"):
        tree_accept(*args, depth=-1)
    with pytest.raises(InputError, match="ranks and step"):
        tree_accept(*args, depth=1, ranks=int64s([[[0]]]))
    with pytest.raises(InputError, match="ranks: expected shape"):
        tree_accept(*args, depth=2, ranks=int64s([[[0]]]), step=int64s([0]))
    with pytest.raises(InputError, match="rows: no layout nodes"):
        tree_accept(*args[:2], torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0, 1, dtype=torch.int64),
                    args[4], depth=1)
    with pytest.raises(InputError, match="target"):
        tree_accept(args[0].float(), *args[1:], depth=1)
    with pytest.raises(InputError, match="out"):
        tree_accept(*args, depth=1, out=torch.zeros(1, 2, dtype=torch.int64))


@pytest.mark.gpu
@pytest.mark.parametrize("greedy", [True, False])
def test_kernel_in_a_cuda_graph_walks_as_the_torch_walk(greedy):
    """On the GPU, captured once and replayed step after step (the ranked walk's step
    advancing on the device): every output equal to the torch walk's, 8x4 trees at batch 4."""
    depth, topk, batch, steps = 8, 4, 4, 4
    q = e2e_acc.load_e2e_acceptance("paper-mbpp").rows(depth, topk)
    plan = e2e_plan.plan_trees(build_layout(depth, topk, q), batch, 32 * batch, q=q)
    ranks = None if greedy else simulated_ranks(q, topk, depth, 7, batch, steps)
    dev = torch.device("cuda")
    walk = DeviceWalk(plan, dev, greedy=greedy, ranks=ranks)
    n = plan.forest.n_nodes
    target = torch.zeros(n, dtype=torch.int64, device=dev)
    tokens = torch.zeros(n, dtype=torch.int64, device=dev)
    walk.sample(target, tokens)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        acc_g, out_g = walk.sample(target, tokens)
        walk.advance()
    gen = torch.Generator(device=dev).manual_seed(1)
    for step in range(steps):
        target.copy_(torch.randint(3, (n,), generator=gen, device=dev))
        tokens.copy_(torch.randint(3, (n,), generator=gen, device=dev))
        acc_t, out_t = walk.sample(target, tokens, kernel=False)
        graph.replay()
        assert torch.equal(acc_g, acc_t) and torch.equal(out_g, out_t), step
