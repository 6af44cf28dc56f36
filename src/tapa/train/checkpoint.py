"""Checkpoints: written atomically, verified on load, independent of the number of processes.

Layout of a run directory:

    RUN/config.json                        model, data and train configs (+ corpus manifest)
    RUN/metrics.jsonl, RUN/metrics.csv     one record per logged step
    RUN/checkpoints/step_XXXXXX/
        model.safetensors                  full (unsharded) weights, fp32; a tied lm_head is omitted
        optimizer.pt                       AdamW state keyed by parameter name (full, unsharded)
        rng.pt                             torch / numpy / python / CUDA RNG states, one per rank
        state.json                         step, tokens, model config, sha256 of the files above
    RUN/checkpoints/latest                 text file naming the newest step directory

Full state dicts come from torch.distributed.checkpoint.state_dict, which gathers FSDP2 shards (and
passes plain or DDP models through), so a checkpoint saved on N processes loads on any M.
A checkpoint is written to a temporary directory and renamed into place; `latest` is replaced
atomically last. A missing, truncated or mismatched checkpoint raises CheckpointError.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tapa._optional import require
from tapa.model import ModelConfig, TapaLM
from tapa.train.distributed import DistInfo, barrier, gather_objects

FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.pt"
RNG = "rng.pt"
STATE = "state.json"
LATEST = "latest"


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or does not fit the model it is loaded into."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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

def save_checkpoint(run_dir: Path, *, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    model_cfg: ModelConfig, info: DistInfo, keep: int, extra: dict) -> Path:
    """Write RUN/checkpoints/step_<step>. Collective: call on every rank; rank 0 writes."""
    save_file = require("safetensors.torch").save_file
    weights = full_model_state(model)
    optim_state = full_optimizer_state(model, optimizer)
    rng_states = gather_objects(_rng_state(), info)
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    if info.is_main:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".tmp-step_{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
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
            "sha256": {name: _sha256(tmp / name) for name in (WEIGHTS, OPTIMIZER, RNG)},
            **extra,
        }
        (tmp / STATE).write_text(json.dumps(state, indent=2))
        if final.exists():  # a rerun of the same step replaces it
            shutil.rmtree(final)
        os.replace(tmp, final)
        write_text_atomic(root / LATEST, final.name + "\n")
        _prune(root, keep)
    barrier(info)
    return final


def _prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# load

def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory, or a run directory (its latest checkpoint)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint path {str(path)!r} does not exist")
    if (path / STATE).is_file():
        return path
    latest = path / "checkpoints" / LATEST
    if latest.is_file():
        target = path / "checkpoints" / latest.read_text().strip()
        if not (target / STATE).is_file():
            raise CheckpointError(f"{str(latest)!r} names {target.name!r}, which is not a complete "
                                  "checkpoint (no state.json)")
        return target
    raise CheckpointError(f"{str(path)!r} is neither a checkpoint directory (with {STATE}) nor a run "
                          "directory with checkpoints/latest")


def has_checkpoint(run_dir: str | os.PathLike) -> bool:
    return (Path(run_dir) / "checkpoints" / LATEST).is_file()


def read_state(checkpoint: Path, *, verify: bool = True) -> dict:
    """state.json of a checkpoint, with its files checked against the recorded sha256."""
    try:
        state = json.loads((checkpoint / STATE).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {str(checkpoint / STATE)!r}: {err}") from err
    if state.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{str(checkpoint)!r} has checkpoint format {state.get('format')!r}, "
                              f"expected {FORMAT_VERSION}")
    if verify:
        for name, expected in state["sha256"].items():
            path = checkpoint / name
            if not path.is_file():
                raise CheckpointError(f"checkpoint file {str(path)!r} is missing")
            if _sha256(path) != expected:
                raise CheckpointError(f"checkpoint file {str(path)!r} is corrupt (sha256 mismatch)")
    return state


def load_weights(checkpoint: Path, model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The checkpoint's full state dict for a TapaLM of `model_cfg`; CheckpointError on mismatch."""
    load_file = require("safetensors.torch").load_file
    try:
        weights = load_file(checkpoint / WEIGHTS)
    except Exception as err:  # safetensors raises its own error types
        raise CheckpointError(f"cannot read {str(checkpoint / WEIGHTS)!r}: {err}") from err
    if model_cfg.tie_embeddings and "embed.weight" in weights:
        weights["lm_head.weight"] = weights["embed.weight"]
    with torch.device("meta"):
        expected = TapaLM(ModelConfig.from_dict(model_cfg.to_dict())).state_dict()
    problems = sorted(set(expected) ^ set(weights))
    problems += [f"{name}: checkpoint {tuple(weights[name].shape)} vs model {tuple(t.shape)}"
                 for name, t in expected.items() if name in weights and weights[name].shape != t.shape]
    if problems:
        raise CheckpointError(f"checkpoint {str(checkpoint)!r} does not match the model config: "
                              f"{problems[:8]}")
    return weights


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
    set_model_state_dict(model, weights, options=_full_options())
    try:
        optim_state = torch.load(checkpoint / OPTIMIZER, map_location="cpu", weights_only=True)
        rng_states = torch.load(checkpoint / RNG, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"cannot read the optimizer/RNG state in {str(checkpoint)!r}: {err}") from err
    set_optimizer_state_dict(model, optimizer, optim_state, options=_full_options())
    # RNG streams are per process; they carry over when the process count is unchanged
    if len(rng_states) == info.world_size:
        _set_rng_state(rng_states[info.rank])
    return state


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu"
               ) -> tuple[TapaLM, ModelConfig, dict]:
    """Load a trained model for evaluation: (TapaLM in eval mode on `device`, its ModelConfig,
    the run's config.json as a dict ({} if the checkpoint sits outside a run directory)).
    `path`: a run directory (its latest checkpoint) or a checkpoint directory."""
    checkpoint = resolve_checkpoint(path)
    state = read_state(checkpoint)
    model_cfg = ModelConfig.from_dict(state["model"])
    weights = load_weights(checkpoint, model_cfg)
    model = TapaLM(model_cfg)
    model.load_state_dict(weights)
    run_config_path = checkpoint.parent.parent / "config.json"
    run_config = json.loads(run_config_path.read_text()) if run_config_path.is_file() else {}
    return model.to(device).eval(), model_cfg, run_config
