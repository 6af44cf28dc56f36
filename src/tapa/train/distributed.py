"""Process-group setup for torchrun (DDP / FSDP2), and the few collectives the trainer needs,
all from torch.distributed: nccl on CUDA, gloo on CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    initialized_here: bool  # this module created the process group and must destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        """True when a process group exists (torchrun, or FSDP2 on a single process)."""
        return dist.is_available() and dist.is_initialized()


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_ENV)


def pick_device(device: str, local_rank: int = 0) -> torch.device:
    """"auto" -> cuda:<local_rank> when CUDA is available, else cpu."""
    if device == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device {device!r} is not a torch device") from err
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        if chosen.index is None:
            chosen = torch.device(f"cuda:{local_rank}")
    return chosen


def setup_distributed(device: str = "auto", *, need_group: bool = False) -> DistInfo:
    """Join torchrun's process group when launched by torchrun; otherwise run as one process,
    creating a single-member group only if `need_group` (FSDP2 at world size 1 needs one)."""
    if dist.is_available() and dist.is_initialized():  # the caller set it up (e.g. tests)
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        chosen = pick_device(device, local_rank)
        if chosen.type == "cuda":
            torch.cuda.set_device(chosen)
        return DistInfo(rank, local_rank, world_size, chosen, initialized_here=False)
    if launched_by_torchrun():
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        chosen = pick_device(device, local_rank)
        if chosen.type == "cuda":
            torch.cuda.set_device(chosen)
        backend = "nccl" if chosen.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=chosen if chosen.type == "cuda" else None)
        return DistInfo(rank, local_rank, world_size, chosen, initialized_here=True)
    chosen = pick_device(device, 0)
    if need_group:
        if chosen.type == "cuda":
            torch.cuda.set_device(chosen)
        backend = "nccl" if chosen.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return DistInfo(0, 0, 1, chosen, initialized_here=True)
    return DistInfo(0, 0, 1, chosen, initialized_here=False)


def teardown(info: DistInfo) -> None:
    if info.initialized_here and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.active and info.world_size > 1:
        dist.barrier()


def mean_across_ranks(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Mean of a tensor over all ranks (a copy; the input is unchanged)."""
    value = value.detach().clone()
    if info.active and info.world_size > 1:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value


def gather_objects(obj, info: DistInfo) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if not (info.active and info.world_size > 1):
        return [obj]
    gathered = [None] * info.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj, info: DistInfo):
    """Rank 0's obj, on every rank."""
    if not (info.active and info.world_size > 1):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
