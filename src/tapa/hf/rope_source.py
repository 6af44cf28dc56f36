"""A tapa model as the source of `tapa convert`: a `tapa train --pe rope` run (or one of a RoPE
rule), given as its run directory, a checkpoint directory, or its `tapa export` directory.

Only models whose layers are all global RoPE-family layers convert: they are what the Llama path
starts from (RoPE everywhere), so the hybrid's local layers keep them exactly. A TAPA, NoPE or
hybrid model is refused in one line. The reading (sha256 checks included) is
`tapa.model.loading`'s; this module says what is a source, refuses what is not, and gives the
hybrid's ModelConfig (the converted weights are `tapa.hf.convert`'s).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from tapa.model import ModelConfig
from tapa.model.config import TAPA_SETTINGS
from tapa.model.loading import (MODEL_TYPE, RUN_CONFIG, STATE, is_model_dir, load_weights, model_dir_config,
                                model_dir_weights, read_state, resolve_checkpoint, run_config)
from tapa.positional.kinds import ROPE_FAMILY, get_kind

SUPPORTED_TAPA_LINE = (f"tapa models whose layers are all global RoPE-family layers (pe {', '.join(ROPE_FAMILY)}; "
                       "a run, a checkpoint or a tapa export)")


@dataclass(frozen=True)
class RopeSource:
    """A tapa RoPE model read for conversion. run_config: the run's config.json (it names the
    token cache whose tokenizer travels with the conversion); None for a transformers directory,
    whose own tokenizer files travel. checkpoint: the directory the weights came from."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    run_config: dict | None
    checkpoint: Path


def is_tapa_source(path: str | Path) -> bool:
    """Whether `path` is a tapa run, a checkpoint or a TAPA transformers directory (rather than
    a Llama-layout one): it is converted by this module's rules, refusals included."""
    path = Path(path).expanduser()
    if (path / STATE).is_file() or (path / "checkpoints").is_dir():
        return True
    try:
        config = json.loads((path / RUN_CONFIG).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == MODEL_TYPE


def check_convertible(cfg: ModelConfig, path: Path) -> None:
    """ValueError in one line unless every layer of `cfg` is a global RoPE-family layer."""
    if cfg.family != "rope" or cfg.is_hybrid:
        raise ValueError(f"{str(path)!r} holds a {cfg.label} model (pe {cfg.pe!r}, layer_pattern "
                         f"{cfg.layer_pattern!r}), which tapa convert does not take; supported: "
                         f"{SUPPORTED_TAPA_LINE}, and Llama, Mistral, Qwen2 or Qwen3 directories")


def read_rope_source(path: str | Path) -> RopeSource:
    """The config and TapaLM weights of a run (its latest checkpoint), a checkpoint or a TAPA
    transformers directory, checked against their sha256; refused before the weights are read
    when the model is not all global RoPE-family layers."""
    path = Path(path).expanduser()
    if is_model_dir(path):
        cfg = model_dir_config(path)
        check_convertible(cfg, path)
        return RopeSource(cfg, model_dir_weights(path, cfg), None, path)
    checkpoint = resolve_checkpoint(path)
    cfg = ModelConfig.from_dict(read_state(checkpoint)["model"])
    check_convertible(cfg, path)
    return RopeSource(cfg, load_weights(checkpoint, cfg), run_config(checkpoint), checkpoint)


def hybrid_config(source: ModelConfig, *, pe: str, theta: float, alpha: float, distance: str,
                  phase_init_scale: float, layer_pattern: str, local_window: int) -> ModelConfig:
    """The converted model's config: the source's, with the flags' positional settings. The source
    has no TAPA layer, so its TAPA settings are the flags' (or the defaults). Local layers use
    plain RoPE without query temperature: a source whose RoPE rule or temperature differs is
    converted with a warning that its local layers drop them (as the Llama path warns)."""
    values = {name: value for name, value in source.to_dict().items()
              if name not in (*TAPA_SETTINGS, "phase_init_scale")}
    values.update(pe=pe, layer_pattern=layer_pattern, local_window=local_window,
                  phase_init_scale=phase_init_scale)
    if get_kind(pe).family == "tapa" and "G" in layer_pattern:
        values.update(theta=theta, alpha=alpha, distance=distance)
    dropped = ([f"RoPE rule {source.pe!r}"] if source.pe != "rope" else []) + \
              (["query temperature"] if source.query_temperature_base else [])
    if dropped and "L" in layer_pattern:
        warnings.warn(f"the source's layers use {' and '.join(dropped)}; local layers use plain RoPE "
                      "(rope_base, no scaling, no temperature), so they drop it", stacklevel=3)
    return ModelConfig.from_dict(values)
