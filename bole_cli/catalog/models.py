"""The hybrid-attention model catalogue: Qwen3.5 family and Qwen3-Next (shared FACTS.md).

A ModelSpec holds only architecture shapes; every byte count (state, snapshots, factors,
KV per token) is derived from it, never hard-coded per model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional


@dataclass(frozen=True)
class ModelSpec:
    name: str  # canonical Hugging Face id
    layers: int
    hidden: int
    attn_heads: int  # full-attention query heads
    attn_kv_heads: int
    gdn_value_heads: int  # HV
    vocab: int
    ffn: int = 0  # dense MLP intermediate size (0 for MoE)
    experts: int = 0
    experts_top_k: int = 0
    expert_ffn: int = 0
    shared_expert_ffn: int = 0
    tied_embeddings: bool = False
    gdn_key_heads: int = 16  # H
    gdn_key_dim: int = 128  # dk
    gdn_value_dim: int = 128  # dv
    conv_kernel: int = 4
    attn_head_dim: int = 256
    full_attention_interval: int = 4
    full_attention_layers: tuple[int, ...] = field(default=())  # explicit layer_types wins
    mtp_layers: int = 1
    aliases: tuple[str, ...] = field(default=(), compare=False)

    # ---- layer structure -------------------------------------------------------------
    @property
    def attention_layer_ids(self) -> tuple[int, ...]:
        if self.full_attention_layers:
            return self.full_attention_layers
        k = self.full_attention_interval
        return tuple(i for i in range(self.layers) if (i + 1) % k == 0)

    @property
    def n_attention_layers(self) -> int:
        return len(self.attention_layer_ids)

    @property
    def n_gdn_layers(self) -> int:
        return self.layers - self.n_attention_layers

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv: q|k|v."""
        return 2 * self.gdn_key_heads * self.gdn_key_dim + self.gdn_value_heads * self.gdn_value_dim

    # ---- bytes -----------------------------------------------------------------------
    def gdn_state_bytes_per_layer(self, state_bytes: int = 4) -> int:
        """One request's recurrent state in one GDN layer: HV * dk * dv elements."""
        return self.gdn_value_heads * self.gdn_key_dim * self.gdn_value_dim * state_bytes

    def gdn_state_bytes(self, state_bytes: int = 4) -> int:
        """One request's recurrent state over all GDN layers."""
        return self.n_gdn_layers * self.gdn_state_bytes_per_layer(state_bytes)

    def conv_state_bytes(self, elem_bytes: int = 2) -> int:
        """One request's conv window (kernel-1 inputs per channel) over all GDN layers."""
        return self.n_gdn_layers * self.conv_dim * (self.conv_kernel - 1) * elem_bytes

    def snapshot_bytes_per_node(self, state_bytes: int = 4) -> int:
        """Per draft node, all GDN layers: one full state snapshot (SGLang's verifier)."""
        return self.gdn_state_bytes(state_bytes)

    def kv_bytes_per_token(self, elem_bytes: int = 2) -> int:
        """KV cache bytes one token costs across all full-attention layers."""
        return self.n_attention_layers * 2 * self.attn_kv_heads * self.attn_head_dim * elem_bytes

    def ffn_description(self) -> str:
        if self.is_moe:
            shared = f", shared {self.shared_expert_ffn}" if self.shared_expert_ffn else ""
            return f"MoE {self.experts}x{self.expert_ffn} top-{self.experts_top_k}{shared}"
        return f"{self.ffn}" + (" (tied emb.)" if self.tied_embeddings else "")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["aliases"] = list(self.aliases)
        d["full_attention_layers"] = list(self.attention_layer_ids)
        return d


_QWEN35_VOCAB = 248320
_QWEN3_NEXT_VOCAB = 151936

CATALOGUE: tuple[ModelSpec, ...] = (
    ModelSpec("Qwen/Qwen3.5-0.8B", 24, 1024, 8, 2, 16, _QWEN35_VOCAB, ffn=3584,
              tied_embeddings=True, aliases=("0.8b",)),
    ModelSpec("Qwen/Qwen3.5-2B", 24, 2048, 8, 2, 16, _QWEN35_VOCAB, ffn=6144,
              tied_embeddings=True, aliases=("2b",)),
    ModelSpec("Qwen/Qwen3.5-4B", 32, 2560, 16, 4, 32, _QWEN35_VOCAB, ffn=9216,
              tied_embeddings=True, aliases=("4b",)),
    ModelSpec("Qwen/Qwen3.5-9B", 32, 4096, 16, 4, 32, _QWEN35_VOCAB, ffn=12288, aliases=("9b",)),
    ModelSpec("Qwen/Qwen3.5-27B", 64, 5120, 24, 4, 48, _QWEN35_VOCAB, ffn=17408, aliases=("27b",)),
    ModelSpec("Qwen/Qwen3.5-35B-A3B", 40, 2048, 16, 2, 32, _QWEN35_VOCAB, experts=256,
              experts_top_k=8, expert_ffn=512, shared_expert_ffn=512, aliases=("35b", "35b-a3b")),
    ModelSpec("Qwen/Qwen3.5-122B-A10B", 48, 3072, 32, 2, 64, _QWEN35_VOCAB, experts=256,
              experts_top_k=8, expert_ffn=1024, shared_expert_ffn=1024,
              aliases=("122b", "122b-a10b")),
    ModelSpec("Qwen/Qwen3.5-397B-A17B", 60, 4096, 32, 2, 64, _QWEN35_VOCAB, experts=512,
              experts_top_k=10, expert_ffn=1024, aliases=("397b", "397b-a17b")),
    ModelSpec("Qwen/Qwen3-Next-80B-A3B", 48, 2048, 16, 2, 32, _QWEN3_NEXT_VOCAB, experts=512,
              experts_top_k=10, expert_ffn=512, shared_expert_ffn=512,
              aliases=("80b", "next-80b", "qwen3-next")),
)
