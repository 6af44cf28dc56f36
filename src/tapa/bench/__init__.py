"""Benchmarks (GPU): the attention kernel, model training throughput, decoding,
the sliding-window (local) attention layer."""
