"""Bole's Triton kernels (docs/design.md §3): closed-form tree verify, factorised and replay commits,
tree-parallel conv and gates, a tree step's metadata (`tree_metadata`), a GEMM for a few rows
(`skinny_mm`), an attention layer's q/k norm, RoPE and cache write (`attention_in`), a
verify's KV commit (`kv_compact`), a drafter level's top-k ids (`draft_topk`), a tree step's
accepted paths (`tree_accept`) and the SGLang plug-in's copy kernels (`conv_window_commit`,
`seed_slots`). Each has a float64 (or, for copies, exact) reference in `reference.py` (the
attention layers' in `reference_attention.py`); tree_metadata's is the runtime's torch refill,
which it replaces on the GPU, tree_accept's bench e2e's torch walk (bench/e2e/device_walk.py),
skinny_mm's a float64 product.

    from bole_cli.kernels import tree_verify, tree_commit

Importing this package picks Triton's CPU interpreter when no CUDA device exists.
"""

from bole_cli.kernels._env import ensure_triton_backend

ensure_triton_backend()

from bole_cli.kernels.attention_in import attention_in  # noqa: E402
from bole_cli.kernels.draft_topk import draft_topk  # noqa: E402
from bole_cli.kernels.gates import gdn_gates  # noqa: E402
from bole_cli.kernels.gdn_decode import gdn_decode  # noqa: E402
from bole_cli.kernels.kv_compact import kv_compact  # noqa: E402
from bole_cli.kernels.skinny_mm import skinny_mm  # noqa: E402
from bole_cli.kernels.tree_accept import tree_accept  # noqa: E402
from bole_cli.kernels.types import VerifyResult  # noqa: E402
from bole_cli.kernels.tree_commit import tree_commit  # noqa: E402
from bole_cli.kernels.tree_commit_replay import tree_commit_replay, tree_commit_replay_gated  # noqa: E402
from bole_cli.kernels.tree_conv import tree_conv, tree_conv_commit  # noqa: E402
from bole_cli.kernels.tree_metadata import tree_metadata  # noqa: E402
from bole_cli.kernels.tree_verify import tree_verify, tree_verify_gated  # noqa: E402

__all__ = ["VerifyResult", "attention_in", "draft_topk", "gdn_decode", "gdn_gates", "kv_compact", "skinny_mm", "tree_accept", "tree_commit", "tree_commit_replay",
           "tree_commit_replay_gated",
           "tree_conv", "tree_conv_commit", "tree_metadata", "tree_verify", "tree_verify_gated"]
