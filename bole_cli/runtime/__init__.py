"""Embedded runtime: the complete Qwen3.5 hybrid forward at catalogue shapes with random
weights (decode, tree verify with Bole's factors or the snapshot baseline, commit), and
the timer the calibration sweep uses. Imports torch: load it inside commands only.
"""

from bole_cli.runtime.gdn_ops import GDNOps
from bole_cli.runtime.model import HybridCache, HybridModel, VerifyOutput, param_bytes, tiny_spec
from bole_cli.runtime.snapshot import SnapshotGDN, load_sglang_gdn

__all__ = ["GDNOps", "HybridCache", "HybridModel", "SnapshotGDN", "VerifyOutput",
           "load_sglang_gdn", "param_bytes", "tiny_spec"]
