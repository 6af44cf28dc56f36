#!/usr/bin/env bash
# Issue 13, Run 27 in one call (step caps 120 + 90 + 90 + 130 s), written 2026-12-04 (eighteenth
# session): Run 26's steps again after its fix (the direct launch handed the compiled kernel's
# launcher a two-dimensional grid: IndexError in every direct launch, 7 CUDA tests failed), into
# /tmp/kernel_run27 and $OUT/kernel_run27.tar.gz. (As run, this file held a copy of Run 26's steps.)
#   device tool: run(command="bash scripts/gpu_h200_kernel_run27.sh", kind="nvidia-h200")
RUN=kernel_run27 exec bash "$(dirname "$0")/gpu_h200_kernel_run26.sh"
