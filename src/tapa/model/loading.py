"""Reading training checkpoints: a run directory or a checkpoint directory -> a TapaLM and its config.

Layout (written by tapa.train.saving, which also keeps the optimizer and RNG state):

    RUN/config.json                        model, data and train configs (+ corpus manifest)
    RUN/checkpoints/step_XXXXXX/
        model.safetensors                  full (unsharded) weights, fp32; a tied lm_head is omitted
        state.json                         step, tokens, model config, sha256 of every file
        (optimizer.pt, rng.pt)             training state, read by tapa.train only
    RUN/checkpoints/latest                 text file naming the newest step directory

Every reader verifies the files against the sha256 in state.json (unless told not to), so a
missing, truncated or mismatched checkpoint raises CheckpointError naming the file.

A transformers model directory that `tapa convert` or `tapa export` wrote (config.json with
model_type "tapa-llama", model.safetensors, tapa_checksums.json) is a starting point too:
`is_model_dir`, `model_dir_config`, `model_dir_weights`, and `load_model` reads it as well (its
run config is {}). Its weight files are checked against tapa_checksums.json when it has one.

    from tapa.model.loading import load_model
    model, model_cfg, run_config = load_model("runs/tiny-tapa-256")
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from tapa._optional import require
from tapa._paths import file_sha256
from tapa.model.attention import upgrade_state_dict
from tapa.model.config import ModelConfig
from tapa.model.decoder import TapaLM

FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
STATE = "state.json"
LATEST = "latest"
RUN_CONFIG = "config.json"
MODEL_TYPE = "tapa-llama"  # the model_type of a transformers TAPA directory (tapa.hf)
HF_PREFIX = "model."  # TapaForCausalLM's weights are TapaLM's under this prefix
HF_CHECKSUMS = "tapa_checksums.json"


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or does not fit the model it is loaded into."""


def read_json(path: str | os.PathLike, what: str = "file") -> dict:
    """A JSON object from `path`; CheckpointError naming the file when it is unreadable or
    truncated (a bare JSONDecodeError says neither which file nor what to do)."""
    path = Path(path)
    try:
        value = json.loads(path.read_text())
    except OSError as err:
        raise CheckpointError(f"cannot read the {what} {str(path)!r}: {err.strerror or err}") from err
    except json.JSONDecodeError as err:
        raise CheckpointError(f"cannot read the {what} {str(path)!r}: it is not valid JSON "
                              f"(truncated or edited?): {err.msg} at line {err.lineno} column "
                              f"{err.colno}") from err
    if not isinstance(value, dict):
        raise CheckpointError(f"the {what} {str(path)!r} does not hold a JSON object")
    return value


def _complete_steps(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if (p / STATE).is_file())


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory, or a run directory: the checkpoint its checkpoints/latest names, or
    (when a kill came between a checkpoint's rename and the update of `latest`) its newest complete
    checkpoint."""
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
    complete = _complete_steps(path)
    if complete:
        return complete[-1]
    if is_model_dir(path):
        model_dir_config(path)  # a model directory of another model_type: say to convert it
        raise CheckpointError(f"{str(path)!r} is a transformers model directory, not a training "
                              "checkpoint; read it with load_model or model_dir_weights")
    raise CheckpointError(f"{str(path)!r} is neither a checkpoint directory (with {STATE}), a run "
                          "directory with checkpoints/latest, nor a transformers model directory "
                          "(config.json and model.safetensors, from tapa convert or tapa export)")


def is_model_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is a transformers model directory (config.json naming a model_type, and
    safetensors weights), rather than a run or a checkpoint."""
    path = Path(path).expanduser()
    if (path / STATE).is_file() or not (path / RUN_CONFIG).is_file():
        return False
    if not any(path.glob("*.safetensors")) and not (path / "model.safetensors.index.json").is_file():
        return False
    try:
        config = json.loads((path / RUN_CONFIG).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" in config


def model_dir_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of a TAPA transformers directory; CheckpointError in one line for another
    model_type (a Llama, Mistral or Qwen2 directory: convert it first)."""
    path = Path(path).expanduser()
    config = read_json(path / RUN_CONFIG, "model config")
    model_type = config.get("model_type")
    if model_type != MODEL_TYPE:
        raise CheckpointError(f"{str(path)!r} holds a {model_type!r} model, not a TAPA one; convert it "
                              f"first: tapa convert {path} OUT_DIR (then start from OUT_DIR)")
    names = {field.name for field in dataclasses.fields(ModelConfig)}
    return ModelConfig.from_dict({name: value for name, value in config.items() if name in names})


def model_dir_weights(path: str | os.PathLike, model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The TapaLM state dict of a TAPA transformers directory (weights checked against its
    tapa_checksums.json, names without the `model.` prefix); CheckpointError on mismatch."""
    load_file = require("safetensors.torch").load_file
    path = Path(path).expanduser()
    files = sorted(path.glob("*.safetensors"))
    sums_file = path / HF_CHECKSUMS
    if sums_file.is_file():
        sums = read_json(sums_file, "checksums file").get("sha256", {})
        for name, expected in sums.items():
            if not (path / name).is_file() or file_sha256(path / name) != expected:
                raise CheckpointError(f"{str(path / name)!r} is missing or does not match its sha256 in "
                                      f"{HF_CHECKSUMS}: it was corrupted or changed after it was written")
    weights = {}
    for file in files:
        try:
            weights.update(load_file(file))
        except Exception as err:  # safetensors raises its own error types
            raise CheckpointError(f"cannot read {str(file)!r}: {err}") from err
    weights = {name.removeprefix(HF_PREFIX): tensor for name, tensor in weights.items()}
    return _checked_weights(weights, model_cfg, path)


def has_checkpoint(run_dir: str | os.PathLike) -> bool:
    """Whether a run directory holds a checkpoint to resume from."""
    return (Path(run_dir) / "checkpoints" / LATEST).is_file() or bool(_complete_steps(Path(run_dir)))


def read_state(checkpoint: Path, *, verify: bool = True) -> dict:
    """state.json of a checkpoint, with its files checked against the recorded sha256."""
    state = read_json(Path(checkpoint) / STATE, "checkpoint state")
    if state.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{str(checkpoint)!r} has checkpoint format {state.get('format')!r}, "
                              f"expected {FORMAT_VERSION}")
    if verify:
        for name, expected in state["sha256"].items():
            path = Path(checkpoint) / name
            if not path.is_file():
                raise CheckpointError(f"checkpoint file {str(path)!r} is missing")
            if file_sha256(path) != expected:
                raise CheckpointError(f"checkpoint file {str(path)!r} is corrupt (sha256 mismatch)")
    return state


def checkpoint_model_config(checkpoint: Path) -> ModelConfig:
    """The ModelConfig a checkpoint was saved with (fields added since then take their defaults)."""
    return ModelConfig.from_dict(read_state(checkpoint, verify=False)["model"])


def run_config(checkpoint: Path) -> dict:
    """The config.json of the run a checkpoint belongs to; {} for a checkpoint outside a run."""
    path = Path(checkpoint).parent.parent / RUN_CONFIG
    return read_json(path, "run config") if path.is_file() else {}


def load_weights(checkpoint: Path, model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The checkpoint's full state dict for a TapaLM of `model_cfg` (in the current layout, whatever
    version of tapa wrote it); CheckpointError on mismatch."""
    load_file = require("safetensors.torch").load_file
    try:
        weights = load_file(Path(checkpoint) / WEIGHTS)
    except Exception as err:  # safetensors raises its own error types
        raise CheckpointError(f"cannot read {str(Path(checkpoint) / WEIGHTS)!r}: {err}") from err
    return _checked_weights(weights, model_cfg, checkpoint)


def _checked_weights(weights: dict, model_cfg: ModelConfig, checkpoint: Path) -> dict[str, torch.Tensor]:
    if model_cfg.tie_embeddings and "embed.weight" in weights:
        weights["lm_head.weight"] = weights["embed.weight"]
    weights = upgrade_state_dict(weights, model_cfg)  # checkpoints written before the phase split
    with torch.device("meta"):
        expected = TapaLM(ModelConfig.from_dict(model_cfg.to_dict())).state_dict()
    problems = sorted(set(expected) ^ set(weights))
    problems += [f"{name}: checkpoint {tuple(weights[name].shape)} vs model {tuple(t.shape)}"
                 for name, t in expected.items() if name in weights and weights[name].shape != t.shape]
    if problems:
        raise CheckpointError(f"checkpoint {str(checkpoint)!r} does not match the model config: "
                              f"{problems[:8]}")
    return weights


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu"
               ) -> tuple[TapaLM, ModelConfig, dict]:
    """Load a trained model for evaluation: (TapaLM in eval mode on `device`, its ModelConfig,
    the run's config.json as a dict ({} if the checkpoint sits outside a run directory)).
    `path`: a run directory (its latest checkpoint), a checkpoint directory, or a TAPA
    transformers model directory (tapa convert / tapa export; its run config is {})."""
    if is_model_dir(path):
        model_cfg = model_dir_config(path)
        model = TapaLM(model_cfg)
        model.load_state_dict(model_dir_weights(path, model_cfg))
        return model.float().to(device).eval(), model_cfg, {}
    checkpoint = resolve_checkpoint(path)
    state = read_state(checkpoint)
    model_cfg = ModelConfig.from_dict(state["model"])
    weights = load_weights(checkpoint, model_cfg)
    model = TapaLM(model_cfg)
    model.load_state_dict(weights)
    return model.to(device).eval(), model_cfg, run_config(checkpoint)
