"""The size limits of Bole's kernels, in one place for everything that checks against them.

Light on purpose (no torch, no triton): trees, the commands and the SGLang planner import
it without loading the kernels. Why each limit is what it is: docs/design.md §3.
"""

#: Nodes one request's tree may hold: the blocked verify kernel keeps each node's ancestor
#: set as a bitmask of MAX_TREE_NODES // 64 64-bit words. SGLang's draft trees stay well
#: below it; a larger tree is almost always a malformed file.
MAX_TREE_NODES = 256

#: Draft nodes one tree holds beside its root: the most levels a chain drafts, and the most
#: candidates one node's children can use; deeper or wider acceptance statistics cannot
#: matter to any tree the kernels take, so files that give more are refused.
MAX_TREE_DRAFTS = MAX_TREE_NODES - 1

#: Largest tree the one-tile verify kernel takes: its [T, T] float32 factors live in
#: registers. Larger trees take the blocked kernel.
MAX_TILE_NODES = 64

#: Past one tile, chains with at least this many strict ancestors at the end (more nodes
#: than this) take the chain verify kernel (state carried in registers: verify 1.7-1.9x
#: faster than the blocked kernel at 256 nodes, H200); a max_depth promise below it means no
#: such chain, so the chain kernel is not launched. Drafters' trees are far shallower.
CHAIN_KERNEL_DEPTH = 16

#: Smallest GDN key dim SGLang's ReplaySSM ring kernel takes: it tiles K in two halves, each
#: fed to tl.dot, which needs 16 at least. The ReplaySSM decoder checks it; bench e2e refuses
#: the decoder before any model is built where the model's key dim is smaller (--tiny's 16).
REPLAYSSM_MIN_KEY_DIM = 32

#: Requests in one batch that any command accepts (a batch of trees, a calibration or serve
#: batch): far above any server's running requests, low enough that a typo fails at once.
MAX_BATCH_REQUESTS = 4096

#: Committed tokens one request's KV cache holds that any command accepts (a calibration's
#: --kv, a benchmark's --context): 16M, far past any model's context window, low enough
#: that a typo fails at once instead of at an allocation.
MAX_CONTEXT_TOKENS = 1 << 24

#: The largest --seed any command takes: numpy's and Optuna's samplers take 32-bit seeds, and
#: torch's generator a 64-bit one, so one range serves every command.
MAX_SEED = 2**32 - 1

#: The verify's dot precisions (Triton's input_precision, and "split": the readout at tf32,
#: the products that make u exact to about float32 (~2^-21 relative), for trees of one
#: tile, tf32x3 elsewhere; docs/design.md §9): the kernels' config= key and `bole bench
#: kernels --precision`.
VERIFY_PRECISIONS = ("tf32", "split", "tf32x3", "ieee")
#: Those the SGLang plug-in takes: it commits by replay at every precision, which split's exact
#: u does not speed up (split pays only with Eq. 10's commit, and loses to the served path at
#: 32-64 nodes: experiments/README.md S5-c).
PLUGIN_VERIFY_PRECISIONS = tuple(p for p in VERIFY_PRECISIONS if p != "split")
#: The precision Bole serves with (docs/design.md §9): the verify's dots at the kernels' choice
#: (None: tf32 for 16-bit activations), the state committed by the float32 replay commit.
#: The one home of this policy: the SGLang plug-in, `bole calibrate`, the benches and the
#: tuned tables all follow it.
SERVED_VERIFY_PRECISION = None

#: Recurrent-state dtypes the verify and commit kernels take (by name: no torch here); the
#: kernels' checks, `bole bench kernels --state-dtype` and the plug-in's refusal read it.
KERNEL_STATE_DTYPES = ("float32", "bfloat16")

#: Accepted paths of at most this many nodes are replayed node by node by the replay commit
#: (every drafter's tree, every tile-sized tree); longer ones (long chains) DP nodes a pass,
#: which was faster for them on the H200 (docs/design.md §2 "Replay commit").
REPLAY_STEP_PATH = 64

#: The replay commit computes the whole accepted path's gates before its steps (instead of each
#: node's with its rows) when its walk holds at least this many parents: faster there on the
#: H200, slower at 16-32 (experiments/NOTES.md "The replay commit's gates by walk size").
REPLAY_GATES_FIRST_PMAX = 64

#: The replay commit takes the state's row stride as a compile-time constant when no accepted
#: path can be longer than this: fewer registers, more programs an SM; with every GDN layer in
#: one launch faster at paths of 4-32 nodes (level at 2), slower at 64-node chains, which keep it
#: a launch argument (experiments/NOTES.md "The state's row stride a constant").
REPLAY_CONST_ROW_PATH = 32

#: Rows of x the skinny GEMM (kernels/skinny_mm.py) takes: a decode step's batch or a small
#: verify's tree tokens, all in one register tile (padded to 16-64); past it a GEMM's weight
#: tiles are reused enough for cuBLAS. A verify must stream as fast as the decode it is priced
#: against, so the kernel covers both.
SKINNY_MM_MAX_ROWS = 64

#: Drafts per node (top-k) the drafter's top-k kernel (kernels/draft_topk.py) ranks: each of
#: its passes picks the k largest one by one, unrolled. EAGLE-style drafters take a handful
#: (SGLang's --speculative-eagle-topk); a wider beam falls back to torch.topk.
DRAFT_TOPK_MAX_K = 16
#: Rows up to which the runtime's default takes its projections through the skinny GEMM
#: (runtime.model.SKINNY_DEFAULT): in_proj and the LM head with the add + RMSNorm before them
#: fused, a one-row decode 0.1-0.2 ms faster at 4B and 27B (9B within noise), at 16 rows
#: slower at 9B and 27B and a 32-token verify 1.3 ms slower at 9B (R-13 to R-15); out_proj,
#: o_proj and down with the 32-row rule of R-12's grid, 0.03-0.1 ms more off a one-row decode
#: (S10-b, an H100). experiments/README.md; rows 2-15 unmeasured.
SKINNY_DEFAULT_MAX_ROWS = 1

#: The fused GDN decode's launch (kernels.gdn_decode) by the value heads a step updates
#: (batch x value heads): rows (at most that many heads, or None for any; value split: the
#: programs each head's rows are spread over; warps a program), the first row that holds the
#: step. One program of 8 warps a head takes 255 registers in the sm_90 compile, one program
#: an SM; four programs of 2 warps were 10% faster at batch 1 and 16-21% at batch 16-64 at 9B,
#: 5% and 18% at 27B's batch 1 and 16 (an H100: experiments/README.md S8-a, S8-d). The H200's
#: sweep (S9-g) gives the same rule, its other launches within 1% where they lead.
#: Re-derived from each device's records by calibrate.components.gdn_decode_launch_rows
#: (tests/test_calibrate.py).
GDN_DECODE_LAUNCH: tuple[tuple[int | None, int, int], ...] = ((78, 4, 2), (156, 8, 2), (None, 4, 2))


GDN_DECODE_HEAD_WARPS = 8  # a whole head's warps (one program a head: the launch before S8-a)


def gdn_decode_warps(split: int) -> int:
    """Warps a program of the fused GDN decode takes by default for a head over `split`
    programs, where no rule row names them: a whole head's warps spread over the split."""
    return max(1, GDN_DECODE_HEAD_WARPS // split)


def gdn_decode_launch(heads: int) -> tuple[int, int]:
    """(value split, warps) of the fused GDN decode over `heads` = batch x value heads."""
    for limit, split, warps in GDN_DECODE_LAUNCH:
        if limit is None or heads <= limit:
            return split, warps
    return GDN_DECODE_LAUNCH[-1][1:]
