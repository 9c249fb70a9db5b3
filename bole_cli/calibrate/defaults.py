"""Sweep defaults (kept import-free so the CLI's --help path stays fast)."""

from bole_cli.limits import MAX_BATCH_REQUESTS, MAX_CONTEXT_TOKENS  # import-free itself

DEFAULT_BATCHES = (1, 2, 4, 8, 16)
DEFAULT_KV_LENS = (1024, 4096, 16384)
# Powers of two with their 1.5x midpoints: the knee falls between doublings on most GPUs,
# and a 2x step would move B_ver by a factor 2.
DEFAULT_GRID = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
DEFAULT_EPS = 0.05
DEFAULT_REPEATS, DEFAULT_WARMUP = 10, 3  # timed and untimed runs per point (the measured path)

# Sanity caps on the sweep's options, checked before any work (a typo such as a 400-digit
# --kv must fail at once, not after the sweep).
MAX_BATCH = MAX_BATCH_REQUESTS
MAX_KV_LEN = MAX_CONTEXT_TOKENS
MAX_GRID_POINT = 1 << 20
MAX_EPS = 10.0
# The estimate prices a step in microseconds: a progress bar only past this many steps
# (about a second of pricing); the measured sweep always shows one.
ESTIMATE_PROGRESS_STEPS = 20_000
