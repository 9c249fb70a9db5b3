"""`bole bench e2e`: autoregressive vs snapshot-tree vs Bole decoding, end to end on the
embedded runtime (acceptance simulated, costs measured; docs/design.md §8).

One job per module: acceptance.py (the simulated acceptance model, its fit to the
drafter's beam tree, the accepted walk), plan.py (the batch budget and the kept trees),
decoders.py (the decoders and their registry), harness.py (E2EBench, the largest-batch
search, run_e2e), report.py (tables, notes, plot of the JSON document).
"""
