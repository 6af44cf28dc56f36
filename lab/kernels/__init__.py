"""The fused kernels' lab: timing other configs than the table's (attention_variants), the SASS
census (kernel_report, fwd_loop_census, fwd_far_attribution), the compiled-code fingerprint of the
shipped configs (kernel_fingerprint), Nsight Compute helpers (ncu_*), and the decode kernel's
probes (decode_*). It imports the library (src/tapa); the library never imports it. Run from the
repository root, e.g. `PYTHONPATH=src python3 -m lab.kernels.attention_variants --help`."""
