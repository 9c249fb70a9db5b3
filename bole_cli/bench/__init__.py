"""GPU benchmarks behind `bole bench`."""
