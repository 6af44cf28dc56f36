"""The toy study (issue 11): arms and protocols (arms), plans (plan), the GPU runner (run, with
preflight and summarize), the aggregation of its job JSONs into results/toy-study (aggregate), and
the multi-GPU scaling report of scripts/multi_gpu_check.sh (scaling_report)."""
