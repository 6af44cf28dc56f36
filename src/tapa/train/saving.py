"""Writing checkpoints, and the training state (optimizer, RNG) that only a resumed run reads.
Reading a model back (resolve, verify, load) lives in tapa.model.loading; its names are
re-exported here.

A checkpoint directory holds, besides what tapa.model.loading describes:
    optimizer.pt    AdamW state keyed by parameter name (full, unsharded)
    rng.pt          torch / numpy / python / CUDA RNG states, one per rank

Full state dicts come from torch.distributed.checkpoint.state_dict, which gathers FSDP2 shards (and
passes plain or DDP models through), so a checkpoint saved on N processes loads on any M.
A checkpoint is written to a temporary directory and renamed into place; `latest` is replaced
atomically last. A write that fails anywhere (a full disk, a file size limit, whichever writer
reports it: safetensors, torch.save or the JSON files) removes the temporary directory and raises
CheckpointWriteError in one line; the previous checkpoint stays the latest. (A kill leaves the
temporary directory; the next start removes it.) Weights that are not finite are never written.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tapa._optional import require
from tapa.model import ModelConfig
from tapa.model.loading import (FORMAT_VERSION, LATEST, STATE, WEIGHTS, CheckpointError,
                                   file_sha256, has_checkpoint, load_model, load_weights,
                                   read_json, read_state, resolve_checkpoint, run_config)
from tapa.train.distributed import DistInfo, broadcast_object, gather_objects

OPTIMIZER = "optimizer.pt"
RNG = "rng.pt"
TMP_PREFIX = ".tmp-"

__all__ = ["CheckpointError", "CheckpointWriteError", "load_model", "load_weights", "read_state",
           "resolve_checkpoint", "has_checkpoint", "save_checkpoint", "load_training_state",
           "write_text_atomic", "remove_partial_checkpoints", "read_json", "run_config"]


class CheckpointWriteError(CheckpointError):
    """A checkpoint (or run file) that could not be written, e.g. on a full disk."""


_FULL = "no space left on device"
_TOO_LARGE = "file too large (the file size limit, ulimit -f, or the filesystem's)"
_QUOTA = "disk quota exceeded"
# how writers that do not raise OSError (safetensors' Rust errors, torch.save) spell the errno
_SPELLED = {_FULL: ("No space left", "os error 28)", "StorageFull"), _TOO_LARGE: ("File too large", "os error 27)"),
            _QUOTA: ("Disk quota", "os error 122)")}


def _describe_write_error(err: BaseException) -> str:
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return {errno.ENOSPC: _FULL, errno.EFBIG: _TOO_LARGE, errno.EDQUOT: _QUOTA}[err.errno]
    text = " ".join(str(err).split())
    for description, spellings in _SPELLED.items():
        if any(spelling in text for spelling in spellings):
            return description
    if isinstance(err, RuntimeError) and "unexpected pos" in text:
        return f"the write was cut short, most likely a full disk ({text})"
    return f"{type(err).__name__}: {text}"


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and a rename, so readers see the old or the new text, never half.
    CheckpointWriteError (the temporary file removed) if the write fails."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CheckpointWriteError(f"cannot write {str(path)!r}: {_describe_write_error(err)}") from err


def remove_partial_checkpoints(run_dir: Path) -> list[Path]:
    """Remove the temporary directories of checkpoints whose writing was interrupted (a killed
    process leaves them); return what was removed."""
    root = Path(run_dir) / "checkpoints"
    partial = sorted(root.glob(TMP_PREFIX + "*")) if root.is_dir() else []
    for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    return partial


# ---------------------------------------------------------------------------------------------
# state dicts (collective under FSDP2: every rank must call these)

def _full_options(**extra):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **extra)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options(cpu_offload=True))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))


def _rng_state() -> dict:
    numpy_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "numpy": (numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)),
                  *numpy_state[2:]),
        "python": random.getstate(),
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


# ---------------------------------------------------------------------------------------------
# save

def _write_checkpoint(tmp: Path, *, step: int, weights: dict, optim_state: dict, rng_states: list,
                      model_cfg: ModelConfig, info: DistInfo, extra: dict) -> None:
    save_file = require("safetensors.torch").save_file
    if model_cfg.tie_embeddings:
        weights.pop("lm_head.weight", None)  # the same tensor as embed.weight
    save_file({name: t.detach().contiguous() for name, t in weights.items()}, tmp / WEIGHTS)
    torch.save(optim_state, tmp / OPTIMIZER)
    torch.save(rng_states, tmp / RNG)
    state = {
        "format": FORMAT_VERSION,
        "step": step,
        "model": model_cfg.to_dict(),
        "world_size": info.world_size,
        "sha256": {name: file_sha256(tmp / name) for name in (WEIGHTS, OPTIMIZER, RNG)},
        **extra,
    }
    (tmp / STATE).write_text(json.dumps(state, indent=2))


def save_checkpoint(run_dir: Path, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    model_cfg: ModelConfig, info: DistInfo, keep: int, extra: dict) -> Path:
    """Write RUN/checkpoints/step_<step>. Collective: call on every rank; rank 0 writes, and every
    rank raises the same CheckpointWriteError if the write fails."""
    weights = full_model_state(model)
    optim_state = full_optimizer_state(model, optimizer)
    rng_states = gather_objects(_rng_state(), info)
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    failure = None
    if info.is_main:
        tmp = root / f"{TMP_PREFIX}step_{step:06d}"
        bad = non_finite(weights)
        if bad:
            failure = (f"training stopped: the weights are not finite at step {step} ({', '.join(bad[:3])}); "
                       "its checkpoint was not written. Resume from the last checkpoint with a lower --lr "
                       "or a longer --warmup-steps")
    if info.is_main and failure is None:
        try:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            _write_checkpoint(tmp, step=step, weights=weights, optim_state=optim_state,
                              rng_states=rng_states, model_cfg=model_cfg, info=info, extra=extra)
            if final.exists():  # a rerun of the same step replaces it
                shutil.rmtree(final)
            os.replace(tmp, final)
            write_text_atomic(root / LATEST, final.name + "\n")
        except Exception as err:  # torch.save: RuntimeError; safetensors: SafetensorError
            shutil.rmtree(tmp, ignore_errors=True)
            previous = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
            failure = (f"cannot write the checkpoint of step {step} to {str(final)!r}: "
                       f"{_describe_write_error(err)}. The partial checkpoint was removed; "
                       + (f"the latest checkpoint is still {previous!r}" if previous
                          else "the run has no checkpoint yet")
                       + ". Free some space and resume with --resume")
        else:
            _prune(root, keep)
    failure = broadcast_object(failure, info)  # also the barrier that waits for rank 0's write
    if failure is not None:
        raise CheckpointWriteError(failure)
    return final


def non_finite(weights: dict[str, torch.Tensor]) -> list[str]:
    """The names of the floating-point tensors that hold nan or inf."""
    return [name for name, t in weights.items()
            if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def _prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# load the training state

def load_training_state(checkpoint: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                        model_cfg: ModelConfig, info: DistInfo) -> dict:
    """Restore weights, optimizer and RNG states into the (possibly wrapped) model; return
    state.json. Every rank reads the files (they are full, unsharded state dicts)."""
    from torch.distributed.checkpoint.state_dict import (set_model_state_dict,
                                                         set_optimizer_state_dict)

    state = read_state(checkpoint)
    saved_cfg = ModelConfig.from_dict(state["model"]).to_dict()  # defaults for newer fields
    if saved_cfg != model_cfg.to_dict():
        diffs = [f"{k}: {saved_cfg.get(k)!r} (checkpoint) vs {v!r}"
                 for k, v in model_cfg.to_dict().items() if saved_cfg.get(k) != v]
        raise CheckpointError(f"checkpoint {str(checkpoint)!r} was saved for another model config: "
                              f"{diffs}")
    weights = load_weights(checkpoint, model_cfg)
    # a copy: under DDP torch renames the keys of the dict it is given to the wrapper's
    # (module.*), and `weights` still names the parameters below
    set_model_state_dict(model, dict(weights), options=_full_options())
    try:
        optim_state = torch.load(checkpoint / OPTIMIZER, map_location="cpu", weights_only=True)
        rng_states = torch.load(checkpoint / RNG, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"cannot read the optimizer/RNG state in {str(checkpoint)!r}: {err}") from err
    def misfit(reason: str) -> CheckpointError:
        return CheckpointError(f"the optimizer state in {str(checkpoint)!r} does not fit this "
                               f"model's parameter groups ({reason}); it was saved by another "
                               "version of tapa. Continue from its weights in a new run instead: "
                               f"tapa train --init-from {checkpoint}")

    saved_groups = optim_state.get("param_groups", [])
    saved_names = {name for group in saved_groups for name in group["params"]}
    unknown = sorted(saved_names - set(weights))
    if len(saved_groups) != len(optimizer.param_groups) or unknown:
        raise misfit(f"{len(saved_groups)} groups for {len(optimizer.param_groups)}"
                     + (f", unknown parameters {unknown[:4]}" if unknown else ""))
    try:
        set_optimizer_state_dict(model, optimizer, optim_state, options=_full_options())
    except (KeyError, ValueError, RuntimeError) as err:
        raise misfit(f"{type(err).__name__}: {err}") from err
    # RNG streams are per process; they carry over when the process count is unchanged
    if len(rng_states) == info.world_size:
        _set_rng_state(rng_states[info.rank])
    return state
