"""`TapaConfig`: the transformers config of a TAPA (or RoPE-family baseline) decoder.

It carries every field of `tapa.model.ModelConfig` under the same name (one name per field from
the command line to the kernel); `attribute_map` adds the names transformers' utilities look for
(hidden_size, num_hidden_layers, ...). config.json always lists every model field, so a saved
checkpoint never depends on the defaults of the tapa version that loads it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from tapa._optional import require
from tapa.model import ModelConfig

PreTrainedConfig = require("transformers").PretrainedConfig

MODEL_TYPE = "tapa-llama"
# The thin modules a saved checkpoint ships for trust_remote_code loading (see `write_remote_code`).
REMOTE_CODE = {
    "configuration_tapa.py": "from tapa.hf.configuration import TapaConfig  # noqa: F401\n",
    "modeling_tapa.py": "from tapa.hf.modeling import TapaForCausalLM  # noqa: F401\n",
}
AUTO_MAP = {
    "AutoConfig": "configuration_tapa.TapaConfig",
    "AutoModelForCausalLM": "modeling_tapa.TapaForCausalLM",
}
_HEADER = ('"""Loads the TAPA model classes from the installed tapa package '
           "(pip install 'tapa-attention[hf]').\n\n"
           "Shipped with the checkpoint so that AutoModelForCausalLM.from_pretrained(path, "
           'trust_remote_code=True)\nworks without importing tapa first."""\n')


def model_field_names() -> list[str]:
    return [field.name for field in dataclasses.fields(ModelConfig)]


def write_remote_code(directory: str | os.PathLike) -> None:
    """Write the trust_remote_code shims next to config.json.

    They import the installed package instead of copying its source, so the reference op stays the
    single definition of TAPA and a checkpoint always runs the installed kernels.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in REMOTE_CODE.items():
        (directory / name).write_text(_HEADER + body)


class TapaConfig(PreTrainedConfig):
    """transformers config for `TapaForCausalLM`; its fields are `tapa.model.ModelConfig`'s.

    Build it from keyword arguments (ModelConfig names, or the transformers aliases in
    `attribute_map`) or from a ModelConfig with `TapaConfig.from_model_config(cfg)`.
    Invalid values raise ValueError (ModelConfig's validation).
    """

    model_type = MODEL_TYPE
    attribute_map = {
        "hidden_size": "dim",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads",
        "intermediate_size": "ffn_dim",
        "rms_norm_eps": "norm_eps",
        "tie_word_embeddings": "tie_embeddings",
        "initializer_range": "init_std",
    }

    def __init__(self, **kwargs):
        for alias, name in self.attribute_map.items():
            if alias in kwargs:
                value = kwargs.pop(alias)
                if name in kwargs and kwargs[name] != value:
                    raise ValueError(f"{alias}={value!r} contradicts {name}={kwargs[name]!r}")
                kwargs[name] = value
        values = {name: kwargs.pop(name) for name in model_field_names() if name in kwargs}
        model_cfg = ModelConfig(**values)  # fills defaults and validates
        for name, value in model_cfg.to_dict().items():
            setattr(self, name, value)
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__init__(**kwargs)

    # transformers' caches read these two: a "sliding_attention" layer's cache keeps only the last
    # sliding_window tokens, so a hybrid's local layers stay bounded in generate(). Derived from
    # layer_pattern and local_window, never stored; a value passed in must agree with them.
    @property
    def layer_types(self) -> list[str]:
        cfg = self.model_config()
        return ["sliding_attention" if cfg.layer_kind(i) == "local" else "full_attention"
                for i in range(cfg.n_layers)]

    @layer_types.setter
    def layer_types(self, value) -> None:
        if value is not None and list(value) != self.layer_types:
            raise ValueError(f"layer_types={value!r} contradicts layer_pattern={self.layer_pattern!r} "
                             f"(set layer_pattern instead)")

    @property
    def sliding_window(self) -> int | None:
        return self.local_window if self.model_config().is_hybrid else None

    @sliding_window.setter
    def sliding_window(self, value) -> None:
        if value is not None and value != self.sliding_window:
            raise ValueError(f"sliding_window={value!r} contradicts local_window={self.local_window!r} "
                             f"and layer_pattern={self.layer_pattern!r} (set those instead)")

    def model_config(self) -> ModelConfig:
        """The `tapa.model.ModelConfig` this config describes (a fresh, validated copy)."""
        return ModelConfig.from_dict({name: getattr(self, name) for name in model_field_names()})

    @classmethod
    def from_model_config(cls, model_cfg: ModelConfig, **kwargs) -> "TapaConfig":
        return cls(**model_cfg.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        model_type = config_dict.get("model_type")
        if model_type is not None and model_type != cls.model_type:
            hint = (" Convert a Llama checkpoint with `tapa convert LLAMA_DIR OUT_DIR`."
                    if model_type == "llama" else "")
            raise ValueError(f"config model_type is {model_type!r}, but TapaConfig reads "
                             f"{cls.model_type!r} configs only.{hint}")
        return super().from_dict(config_dict, **kwargs)

    def to_diff_dict(self) -> dict:
        diff = super().to_diff_dict()
        diff.update(self.model_config().to_dict())  # every model field, defaults included
        return diff

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
        write_remote_code(save_directory)
