"""Data parallelism applied from outside the model (the model definition knows nothing of it):
DDP, or FSDP2 (`torch.distributed.fsdp.fully_shard`, one unit per decoder block plus the root).
Also optional per-block torch.compile.

Under context parallelism (`tapa.train.context_parallel`, --cp) the wrapper spans every rank, of
the data and the context axes alike: each rank holds the whole model, and its gradients are
averaged over all of them (the CP loss's backward scales each rank's share so that this average
is the one-process gradient). FSDP2 shards over all ranks too, as torchtitan shards over its
flattened data x context mesh."""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

from tapa.train.distributed import DistInfo


def resolve_parallel(mode: str, info: DistInfo) -> str:
    """"auto" -> "ddp" with more than one process, else "none"."""
    if mode == "auto":
        return "ddp" if info.world_size > 1 else "none"
    if mode == "none" and info.world_size > 1:
        raise ValueError(f"parallel='none' with {info.world_size} processes would train "
                         "unsynchronized copies; use ddp or fsdp")
    if mode == "ddp" and info.world_size == 1:  # DDP over one process is the plain model
        warnings.warn("--parallel ddp in a single process trains the plain model; for data parallelism "
                      "launch under torchrun (torchrun --nproc-per-node N -m tapa.cli train ...)", stacklevel=2)
        return "none"
    return mode


def compile_blocks(model: nn.Module) -> None:
    """torch.compile each decoder block in place (before wrapping, as FSDP2 expects)."""
    for block in model.layers:
        block.compile()


def parallelize(model: nn.Module, mode: str, info: DistInfo, *, bf16: bool) -> nn.Module:
    """Wrap `model` (already on info.device for ddp/none; anywhere for fsdp) for `mode`."""
    if mode == "none":
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [info.device.index] if info.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(info.device.type, (info.world_size,))
        # bf16 compute and all-gathers, fp32 gradient reduction and master weights
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if bf16 else MixedPrecisionPolicy())
        for block in model.layers:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model
    raise ValueError(f"unknown parallel mode {mode!r}")


def gradient_sync(model: nn.Module, sync: bool):
    """Context for one micro-batch's backward: skip the gradient all-reduce unless `sync`
    (the last micro-batch of an accumulation)."""
    if hasattr(model, "no_sync") and not sync:  # DDP
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()
