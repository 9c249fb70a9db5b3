"""The served precision contract, measured (docs/design.md §9): a GDN layer's verify +
commit at each precision beside SGLang's, against the float64 sequential recurrence on the
same bf16 inputs. `experiments/precision_contract.py` writes the record;
`tests/test_precision_contract.py` holds the contract on the GPU.

    o_rms              ||o - o_ref|| / ||o_ref||, o_ref the float64 recurrence's outputs
    o_floor_rms        the same for bf16(o_ref): no bf16 output does better
    state_rms_single   the state committed after each request's accepted node against the
                       float64 recurrence's state there (one verify + commit)
    state_rms_after_400  `drift`: 400 verify + commit steps (chains of 4 at batch 4, all
                       accepted, fresh inputs each step), each side carrying its own state

Implementations: "served" (the kernels' dots, tf32 for bf16, and the replay commit), "tf32"
and "tf32x3" (that verify's dots and Eq. 10's factorised commit from its u, the path served
before), "split" (the readout at tf32, u exact to float32, and Eq. 10's commit: the candidate
for the served default, docs/design.md §9), "sglang-recurrent" (SGLang 0.5.23's serial tree
verify with a float32 snapshot per node, the accepted one copied back).
"""

from __future__ import annotations

import random

CASES = [  # (tree, nodes, batch)
    ("chain", 16, 4), ("chain", 64, 4), ("chain", 256, 2),
    ("random", 64, 4), ("random", 32, 16), ("random", 256, 2),
]
SMOKE_CASES = [("chain", 9, 2), ("random", 12, 2)]
DECAYS = {"mild": (-0.05, 0.0), "strong": (-3.0, 0.0)}
IMPLS = ("served", "tf32", "split", "tf32x3", "sglang-recurrent")
DRIFT = dict(tree="chain", nodes=4, batch=4, steps=400)


def rms(got, want) -> float:
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm()).item()


def make_inputs(torch, spec, tree, nodes, batch, decay, seed, state_dtype, device="cuda"):
    """Random layer inputs whose gates give g in the decay range: A_log = 0, dt_bias = 0 and
    a = log(expm1(-g)) (SGLang computes the same gates from a and b)."""
    from bole_cli.kernels import gdn_gates
    from bole_cli.timing import LayerInputs

    s = LayerInputs(torch, spec, batch, nodes, tree, seed, torch.bfloat16, state_dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    lo, hi = DECAYS[decay]
    target = lo + (hi - lo) * torch.rand(s.a.shape, generator=gen, device=device)
    target = target.clamp(max=-1e-6)
    s.a = torch.log(torch.expm1(-target.double())).to(torch.bfloat16)
    s.A_log = torch.zeros_like(s.A_log)
    s.dt_bias = torch.zeros_like(s.dt_bias)
    s.g, s.beta = gdn_gates(s.A_log, s.a, s.dt_bias, s.b)
    rng = random.Random(seed)
    # chains: the whole chain accepted; trees: a random node
    s.accepted = torch.tensor([nodes - 1 if tree == "chain" else rng.randint(0, nodes - 1) for _ in range(batch)],
                              dtype=torch.int32, device=device)
    return s


def reference(torch, s):
    """float64 o and the per-node states of the sequential recurrence."""
    from bole_cli.kernels.reference import tree_verify_sequential_ref

    return tree_verify_sequential_ref(s.q, s.k, s.v, s.g, s.beta, s.pool, s.slots, s.parents, s.cu)


def run_impl(torch, impl, s, sg):
    """One verify + commit of `impl` on a copy of the pool: (o, the committed pool)."""
    from bole_cli import kernels

    pool = s.pool.clone()
    if impl == "sglang-recurrent":
        snaps = s.snapshots  # SGLang's per-node buffer, [B, T, HV, V, K] float32: scratch of this call
        o = sg.target_verify(s.A_log, s.dt_bias, s.q[None], s.k[None], s.v[None], s.a, s.b,
                             ssm_states=pool, cache_indices=s.slots, query_start_loc=s.cu,
                             intermediate_states_buffer=snaps, intermediate_state_indices=s.snap_rows,
                             cache_steps=s.nodes, retrieve_parent_token=s.rpt)
        o = o[0].reshape(s.v.shape)
        sg.copy_back_accepted(pool[None], snaps[None], s.slots, s.accepted)
        return o, pool
    config = None if impl == "served" else {"precision": impl}
    res = kernels.tree_verify(s.q, s.k, s.v, s.g, s.beta, pool, s.slots, s.parents, s.cu, config=config,
                              check_trees=False, max_nodes=s.nodes)
    if impl == "served":
        kernels.tree_commit_replay(pool, s.slots, s.k, s.v, s.g, s.beta, s.parents, s.cu, s.accepted)
    else:
        kernels.tree_commit(pool, s.slots, s.k, res.u, res.log_p, s.parents, s.cu, s.accepted)
    return res.o, pool


def committed_reference(torch, s, states):
    idx = s.cu[:-1].long() + s.accepted.long()
    return states[idx]  # [B, HV, V, K] float64


def drift(torch, spec, impl, decay, state_dtype, sg, device="cuda", steps=DRIFT["steps"]):
    """state_rms_after_400: `steps` verify + commit steps of chains of 4, all accepted."""
    base = make_inputs(torch, spec, DRIFT["tree"], DRIFT["nodes"], DRIFT["batch"], decay, 7, state_dtype, device)
    pool = base.pool.clone()
    ref_states = base.pool[base.slots.long()].double()  # the float64 recurrence's own state
    from bole_cli.kernels.reference import tree_verify_sequential_ref

    for step in range(steps):
        s = make_inputs(torch, spec, DRIFT["tree"], DRIFT["nodes"], DRIFT["batch"], decay, 1000 + step,
                        state_dtype, device)
        s.pool, s.slots = pool, base.slots
        _, pool = run_impl(torch, impl, s, sg)
        ref_pool = torch.zeros(pool.shape, dtype=torch.float64, device=device)
        ref_pool[s.slots.long()] = ref_states
        _, states = tree_verify_sequential_ref(s.q, s.k, s.v, s.g, s.beta, ref_pool, s.slots, s.parents, s.cu)
        ref_states = committed_reference(torch, s, states)
        if state_dtype != torch.float32:  # the reference of a 16-bit pool rounds once per commit
            ref_states = ref_states.to(state_dtype).double()
    return rms(pool[base.slots.long()], ref_states)


