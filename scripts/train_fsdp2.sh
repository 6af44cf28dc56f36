#!/usr/bin/env bash
# Fully sharded data parallel training (FSDP2: torch.distributed.fsdp.fully_shard, one unit per
# decoder block) with torchrun. Parameters, gradients and AdamW state are sharded over the
# processes; checkpoints hold full tensors, so a run saved on N GPUs resumes on any M.
#
#   scripts/train_fsdp2.sh --recipe gpu-350m
#   NPROC=1 scripts/train_fsdp2.sh --recipe gpu-350m        # FSDP2 at world size 1
#   scripts/train_fsdp2.sh --run-dir runs/gpu-350m-tapa-8192 --resume
#   Several machines: NNODES, NODE_RANK, MASTER_ADDR as for scripts/train_ddp.sh.
set -euo pipefail
PARALLEL=fsdp exec "$(dirname "$0")/train_ddp.sh" "$@"
