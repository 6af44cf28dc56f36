#!/usr/bin/env bash
# Data-parallel training (DDP) with torchrun on every GPU of this machine, or on several machines.
#
#   scripts/train_ddp.sh --recipe toy-gpu                 # all local GPUs
#   NPROC=2 scripts/train_ddp.sh --recipe toy-gpu --steps 500
#   NPROC=2 scripts/train_ddp.sh --recipe tiny --device cpu   # CPU processes (gloo)
#   Several machines: run on each with NNODES, NODE_RANK, MASTER_ADDR (and MASTER_PORT) set.
#
# Every argument goes to `tapa train`. batch_size in a recipe is the global batch, so the same
# recipe trains the same way on any number of processes. The machine's NCCL settings are used
# as they are.
set -euo pipefail
PARALLEL=${PARALLEL:-ddp}
NPROC=${NPROC:-$(python -c "import torch; print(torch.cuda.device_count() or 2)")}
if [[ "${NNODES:-1}" -gt 1 ]]; then
    LAUNCH=(--nnodes "$NNODES" --node_rank "${NODE_RANK:?set NODE_RANK}" --rdzv_backend c10d
            --rdzv_endpoint "${MASTER_ADDR:?set MASTER_ADDR}:${MASTER_PORT:-29500}"
            --rdzv_id "${RDZV_ID:-tapa}")
else
    LAUNCH=(--standalone)
fi
# build the data cache in one process first: a long tokenization inside torchrun would leave the
# other ranks waiting at a barrier until the process-group timeout
python -m tapa.cli train "$@" --data-only
exec torchrun "${LAUNCH[@]}" --nproc_per_node "$NPROC" -m tapa.cli train --parallel "$PARALLEL" "$@"
