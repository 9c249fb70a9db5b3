"""`bole acceptance`: measure how a model's own MTP head is accepted (docs/design.md §8).

One job per module:
- prompts: the user's prompt file (JSON lines), checked and hashed;
- checkpoint: a local Hugging Face checkpoint, checked without torch or transformers (a
  GDN hybrid config, `mtp.*` tensors, a tokenizer) and loaded with transformers;
- head: the MTP layer (SGLang 0.5.23's Qwen3.5 / Qwen3-Next MTP: embedding and hidden
  state normed, concatenated, `fc`, one full-attention decoder layer, a norm, the target's
  LM head), built from the target's own decoder-layer class;
- measure: teacher forcing along the target's greedy continuation: one target forward per
  prompt and one MTP pass per draft depth, the rank of the target's token at every depth;
- stats: counts -> q[d][r], Wilson intervals, the chain statistics;
- run: the command in order (check everything, load, measure with progress, write the
  acceptance file atomically, keep what was measured on Ctrl-C);
- plot: the matrix and the expected committed tokens against the tree budget.

The acceptance file's format lives in bole_cli/calibrate/acceptance.py (one home for it).
torch and transformers load only inside the functions that need them.
"""
