"""Benchmarks (GPU): the attention kernel, model training throughput, decoding."""
