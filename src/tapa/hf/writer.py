"""Write a transformers model directory from a `TapaLM` state dict, without building the model.

`tapa export` (training checkpoints) and `tapa convert` (Llama checkpoints) both end here, so a
7B conversion never materializes a randomly initialized model. The directory holds config.json
(every ModelConfig field), model.safetensors (weights named `model.<TapaLM name>`, a tied lm_head
omitted), generation_config.json, the trust_remote_code shims, and CHECKSUMS: the sha256 of
model.safetensors, which `TapaForCausalLM.from_pretrained` checks (a bit flip on disk or in a copy
is an error, not a model with other logits; safetensors' own readers ignore the file).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tapa._optional import require
from tapa._paths import file_sha256, set_default_mode
from tapa.hf.configuration import REMOTE_CODE, TapaConfig
from tapa.model import ModelConfig, TapaLM, upgrade_state_dict

WEIGHTS_NAME = "model.safetensors"
PREFIX = "model."
CHECKSUMS = "tapa_checksums.json"
# what write_pretrained writes, and the tokenizer files export and convert add next to it
MODEL_FILES = ("config.json", "generation_config.json", WEIGHTS_NAME, CHECKSUMS, *REMOTE_CODE)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja")


def expected_shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every TapaLM state-dict entry and its shape (built on the meta device: no memory, no init)."""
    with torch.device("meta"):
        lm = TapaLM(ModelConfig.from_dict(model_cfg.to_dict()))
    return {name: tuple(t.shape) for name, t in lm.state_dict().items()}


def check_state_dict(state: dict[str, torch.Tensor], model_cfg: ModelConfig, source: str) -> None:
    """ValueError listing missing, unexpected and mis-shaped entries."""
    expected = expected_shapes(model_cfg)
    if model_cfg.tie_embeddings:
        expected.pop("lm_head.weight")
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    problems = [f"missing {name}" for name in sorted(set(expected) - set(state))]
    problems += [f"unexpected {name}" for name in sorted(set(state) - set(expected))]
    problems += [f"{name}: {tuple(t.shape)} vs config {expected[name]}" for name, t in state.items()
                 if name in expected and tuple(t.shape) != expected[name]]
    if problems:
        raise ValueError(f"{source}: weights do not fit the model config: {problems[:10]}")


def write_checksums(directory: str | Path) -> Path:
    """CHECKSUMS for the weight files (*.safetensors) in `directory`."""
    directory = Path(directory)
    sums = {path.name: file_sha256(path) for path in sorted(directory.glob("*.safetensors"))}
    path = directory / CHECKSUMS
    path.write_text(json.dumps({"sha256": sums, "written_by": "tapa; checked by TapaForCausalLM.from_pretrained"},
                               indent=2) + "\n")
    return path


def verify_checksums(directory: str | Path) -> None:
    """Check the files CHECKSUMS lists in a local model directory (nothing to do without one);
    ValueError naming the file that does not match."""
    directory = Path(directory)
    path = directory / CHECKSUMS
    if not path.is_file():
        return
    try:
        sums = json.loads(path.read_text())["sha256"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{str(path)!r} is damaged ({err}); export the model again") from err
    for name, expected in sums.items():
        target = directory / name
        if not target.is_file():
            raise ValueError(f"{str(target)!r} is missing (listed in {CHECKSUMS}); export the model again")
        if file_sha256(target) != expected:
            raise ValueError(f"{str(target)!r} does not match its sha256 in {CHECKSUMS}: it was corrupted or "
                             "changed after it was written. Export the model again (or, to load it as it is, pass "
                             f"verify_checksums=False or delete {CHECKSUMS})")


def write_pretrained(out_dir: str | Path, model_cfg: ModelConfig, state: dict[str, torch.Tensor], *,
                     dtype: torch.dtype | None = None, eos_token_id: int | None = None,
                     pad_token_id: int | None = None, source: str = "state dict") -> Path:
    """Save `state` (TapaLM names) as a transformers TapaForCausalLM directory; returns out_dir."""
    save_file = require("safetensors.torch").save_file
    generation_config_class = require("transformers").GenerationConfig
    state = upgrade_state_dict(state, model_cfg)
    check_state_dict(state, model_cfg, source)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {}
    for name, tensor in state.items():
        if model_cfg.tie_embeddings and name == "lm_head.weight":
            continue
        tensor = tensor.detach().to("cpu")
        weights[PREFIX + name] = (tensor.to(dtype) if dtype is not None else tensor).contiguous()
    save_file(weights, str(out_dir / WEIGHTS_NAME), metadata={"format": "pt"})
    set_default_mode(out_dir / WEIGHTS_NAME)  # safetensors creates it 0600; the other files are 0644
    write_checksums(out_dir)
    config = TapaConfig.from_model_config(model_cfg, architectures=["TapaForCausalLM"],
                                          eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    config.dtype = dtype or next(iter(weights.values())).dtype
    config.save_pretrained(out_dir)
    generation = generation_config_class(eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    generation.save_pretrained(out_dir)
    return out_dir


