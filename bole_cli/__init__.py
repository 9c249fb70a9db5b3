"""Bole: closed-form tree speculative decoding for hybrid-attention language models."""

__version__ = "0.1.0"
