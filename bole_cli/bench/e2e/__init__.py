"""`bole bench e2e`: autoregressive vs snapshot-tree vs Bole decoding, end to end on the
embedded runtime (acceptance simulated, costs measured; docs/design.md §8).

One job per module: options.py (the options, checked once into the run's E2EConfig; no
torch), simulated_acceptance.py (the simulated acceptance model, its fit to the drafter's
beam tree, the accepted walk), tree_budget.py (the batch budget and the kept trees),
decoders.py (the decoders and their registry), harness.py (E2EBench: one timed run, the
largest-batch probes), sweep.py (run_e2e: the sweep over batches and decoders, then the
verdicts and the search), verdicts.py (speedups, tree against chain, exactness),
prediction.py (the calibration profile's price of each run), report.py (the JSON document,
its tables, notes and plot).
"""
