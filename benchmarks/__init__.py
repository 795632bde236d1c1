"""Benchmarks for recurscan: a registry of named workloads (:mod:`benchmarks.registry`), a runner
that times recurscan and its peers in one process and saves JSON (:mod:`benchmarks.runner`), and
the CPU comparison with transformers' pure-PyTorch Gated DeltaNet (:mod:`benchmarks.cpu_transformers`).
See benchmarks/README.md."""
